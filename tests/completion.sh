#!/usr/bin/env bash
# The bash completion each command prints (--completion bash, generated from
# its table of forms), run in bash as bash runs it: before any form's option it
# and after each of its forms' options it offers, together, exactly the options
# --help lists; after one, only what that form takes.
# Usage: completion.sh (binaries from HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_FLEET).
set -euo pipefail
fails=0

# Long options (and -x short ones) at the start of --help's option lines, as man_help.sh reads them.
help_options() {
  "$1" --help | grep -oE '^ {2,}(-[a-zA-Z], ?)?--[a-z][a-z-]*|^ {2,}-[a-zA-Z]\b' | grep -oE -- '--?[a-zA-Z][a-z-]*' | sort -u
}

# What the completion of command $1 (binary $2) offers for the words after it (the last: the one completed).
offered() {
  local name=$1 bin=$2
  shift 2
  bash -c '
    set -e
    source <("$1" --completion bash)
    COMP_WORDS=("$2" "${@:3}")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    fn=$(complete -p "$2" | grep -oE -- "-F [^ ]+" | cut -d" " -f2)
    "$fn" "$2" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
    printf "%s\n" "${COMPREPLY[@]}"
  ' _ "$bin" "$name" "$@" | sort -u
}

check() {  # check WHAT EXPECTED ACTUAL
  if [ "$2" != "$3" ]; then
    echo "FAIL $1: offered $(echo $3), expected $(echo $2)"
    fails=$((fails + 1))
  else
    echo "PASS $1"
  fi
}

# Every option --help lists, no more: what is offered before any form's
# option, and after each option offered there (a form's: then that form's).
for pair in "delta-diff:${HFDELTA_DIFF:?}" "delta-apply:${HFDELTA_APPLY:?}" "delta-fleet:${HFDELTA_FLEET:?}"; do
  name=${pair%%:*} bin=${pair#*:}
  first=$(offered "$name" "$bin" -)
  all=$(for o in $first; do echo "$o"; offered "$name" "$bin" "$o" x -; done | sort -u)
  check "$name: every form's options" "$(help_options "$bin")" "$all"
done

# Within a form, only its options: the common ones and its own.
common_apply="-h --help --json --lock-timeout --no-sync --progress --quiet --stop-grace --threads -q"
sorted() { tr ' ' '\n' | sort -u; }
check "delta-apply --status -" "$(echo "$common_apply" | sorted)" "$(offered delta-apply "$HFDELTA_APPLY" --status -)"
check "delta-apply --init x -" "$(echo "$common_apply --init-version --force --then --metrics" | sorted)" \
  "$(offered delta-apply "$HFDELTA_APPLY" --init x -)"
check "delta-apply --root R --rep" "--report-to" "$(offered delta-apply "$HFDELTA_APPLY" --root R --rep)"
check "delta-diff --prune R -" "$(echo "-h --help --json --progress --quiet -q --keep-from --dry-run --no-sync" | sorted)" \
  "$(offered delta-diff "$HFDELTA_DIFF" --prune R -)"
check "delta-fleet --fail" "$(echo "--fail-behind --fail-stale" | sorted)" "$(offered delta-fleet "$HFDELTA_FLEET" --fail)"
# A path: no option words (bash then completes file names).
check "delta-apply --root " "" "$(offered delta-apply "$HFDELTA_APPLY" --root "")"
exit $((fails > 0))

#!/usr/bin/env bash
# The zsh completion each command prints (--completion zsh: its bash
# completion under zsh's bashcompinit), run in an interactive zsh on a
# pseudo-terminal (zsh/zpty): a line is typed, Tab pressed, and the line as
# zsh left it is compared with what completion.sh expects of bash.
# Usage: completion_zsh.sh (binaries from HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_FLEET).
# Exit 77 (skipped) where zsh is not installed.
set -uo pipefail
if ! command -v zsh > /dev/null; then
  echo "SKIP: zsh is not installed (apt-get install zsh); the zsh completion is not tried"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/models/abcdef"
fails=0

# completed BIN LINE: the line after Tab, in zsh with BIN's completion loaded.
completed() {
  rm -f "$work/buffer"
  BIN=$(readlink -f "$1") LINE=$2 OUT=$work/buffer DIR=$work zsh -f -c '
    zmodload zsh/zpty
    zpty z "zsh -f -i"
    zpty -w z "PS1=\"> \"; cd \"$DIR\"; autoload -U compinit && compinit -u"
    zpty -w z "source <(\"$BIN\" --completion zsh)"
    zpty -w z "dump() { print -r -- \"\$BUFFER\" > \"$OUT\"; }; zle -N dump; bindkey \"^X\" dump"
    zpty -w z "print -r -- RE\"\"ADY"
    zpty -r -m z out "*READY*"  # set up: what is typed next is completed
    zpty -n -w z "$LINE"$'"'"'\t'"'"'$'"'"'\C-x'"'"'
    for i in {1..100}; do [[ -s $OUT ]] && break; sleep 0.1; done
    zpty -d z
  ' > /dev/null 2>&1
  cat "$work/buffer" 2> /dev/null
}

check() {  # check BIN LINE EXPECTED
  local got
  got=$(completed "$1" "$2")
  if [ "$got" != "$3" ]; then
    echo "FAIL '$2' + Tab: '$got', expected '$3'"
    fails=$((fails + 1))
  else
    echo "PASS '$2' + Tab: '$got'"
  fi
}

check "${HFDELTA_FLEET:?}" "delta-fleet --fail-b" "delta-fleet --fail-behind "
check "${HFDELTA_APPLY:?}" "delta-apply --root R --rep" "delta-apply --root R --report-to "
check "${HFDELTA_DIFF:?}" "delta-diff --prune R --keep" "delta-diff --prune R --keep-from "
# Not an option of the --status form: nothing offered.
check "$HFDELTA_APPLY" "delta-apply --status --ini" "delta-apply --status --ini"
# A path: file names.
check "$HFDELTA_APPLY" "delta-apply --root models/ab" "delta-apply --root models/abcdef/"
exit $((fails > 0))

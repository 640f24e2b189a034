#!/usr/bin/env bash
# The man pages against --help: every option --help lists is documented in the
# man page's OPTIONS section, and every option documented there is one --help
# lists. Usage: man_help.sh MANDIR (binaries from HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_FLEET).
set -euo pipefail
mandir=$1
fails=0

# Long options (and -x short ones) at the start of --help's option lines.
help_options() {
  "$1" --help | grep -oE '^ {2,}(-[a-zA-Z], ?)?--[a-z][a-z-]*|^ {2,}-[a-zA-Z]\b' | grep -oE -- '--?[a-zA-Z][a-z-]*' | sort -u
}

# Options named on the first line after each .TP of the OPTIONS section.
man_options() {
  awk '/^\.SH /{ in_opts = ($0 ~ /^\.SH OPTIONS/) } in_opts && prev == ".TP" { print } { prev = $0 }' "$1" |
    sed 's/\\-/-/g' | grep -oE -- '(^|[ "])--?[a-zA-Z][a-z-]*' | grep -oE -- '--?[a-zA-Z][a-z-]*' | sort -u
}

for pair in "delta-diff:${HFDELTA_DIFF:?}" "delta-apply:${HFDELTA_APPLY:?}" "delta-fleet:${HFDELTA_FLEET:?}"; do
  name=${pair%%:*} bin=${pair#*:}
  page=$mandir/$name.1
  only_help=$(comm -23 <(help_options "$bin") <(man_options "$page"))
  only_man=$(comm -13 <(help_options "$bin") <(man_options "$page"))
  n=$(help_options "$bin" | wc -l)
  if [ -n "$only_help" ]; then echo "FAIL $name: in --help but not in $page OPTIONS: $(echo $only_help)"; fails=$((fails + 1)); fi
  if [ -n "$only_man" ]; then echo "FAIL $name: in $page OPTIONS but not in --help: $(echo $only_man)"; fails=$((fails + 1)); fi
  [ -n "$only_help$only_man" ] || echo "PASS $name: the $n options of --help are the options of $page"
done
exit $((fails > 0))

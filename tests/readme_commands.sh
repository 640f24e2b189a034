#!/usr/bin/env bash
# The documentation's commands, as written, in order: every ```sh block of the
# pages given, one page after another (the README's quickstart first, then the
# docs pages that continue from the state it leaves), run from a fresh
# directory on generated checkpoints. Fails at the first block that fails,
# printing its block, and says per page how many blocks it ran.
#
# In these pages ```sh means "runs as written". A block that is shown but not
# meant to run (an install, placeholders, the object-store recipe, which
# tests/object_store.sh runs against a real store) is fenced ```bash instead.
# A page of the repository (README.md, docs/*.md) that is not given but holds a
# ```sh block fails the test too, so that no block is skipped silently.
#
# What is not this machine's is mapped, never the commands themselves: the
# absolute paths (/models, /ckpt, /shared, /local, /tmp/hfdelta-try, /usr/local/bin, /run,
# /etc/systemd, /etc/default, /etc/hfdelta, /var/lib/node_exporter) go below a temporary directory; curl (no engine
# here), systemctl and journalctl are stand-ins that record their arguments;
# `while sleep 30; do` runs its body twice; contrib/ is the clone's. The
# commands are found on PATH, as installed: delta-diff, delta-apply, delta-fleet, hfdelta-gen.
# Usage: readme_commands.sh PAGE.md... (binaries from HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_GEN)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: readme_commands.sh PAGE.md..."; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
pages=()
for p in "$@"; do
  [ -f "$p" ] || { echo "FAIL $p: no such page"; exit 1; }
  pages+=("$(cd "$(dirname "$p")" && pwd)/$(basename "$p")")
done
T=$(mktemp -d /tmp/hfdelta-readme.XXXXXX)
trap 'rm -rf "$T"' EXIT
bindir=$(dirname "${HFDELTA_APPLY:?}")
[ "$(dirname "${HFDELTA_DIFF:?}")" = "$bindir" ] || { echo "delta-diff and delta-apply must be in one directory"; exit 2; }

# The ```sh blocks of page $1, one file each, into directory $2; prints how many.
# A fence may be indented (a block inside a list item).
extract() {
  mkdir -p "$2"
  awk -v dir="$2" '
    !c && /^[ \t]*```sh[ \t]*$/ { c = 1; n++; f = dir "/block" sprintf("%02d", n); printf "" > f; next }
    c && /^[ \t]*```/ { c = 0; close(f); next }
    c { print > f }
    END { if (c) { print "unclosed ```sh block " n > "/dev/stderr"; exit 1 } print n + 0 }' "$1"
}

# Pages of the repository that hold runnable blocks but were not given.
for f in "$repo/README.md" "$repo"/docs/*.md; do
  [ -f "$f" ] || continue
  given=0
  for p in "${pages[@]}"; do [ "$p" -ef "$f" ] && given=1; done
  if [ "$given" = 0 ] && grep -qE '^[[:space:]]*```sh[[:space:]]*$' "$f"; then
    echo "FAIL ${f#"$repo"/} has \`\`\`sh blocks but is not among the pages run: add it to the command line, or fence blocks that are not meant to run \`\`\`bash"
    exit 1
  fi
done

# The checkpoints the pages name: a base and five saves.
"${HFDELTA_GEN:?}" --preset tiny --saves 5 --lr 1e-5 "$T/series" > /dev/null 2>&1
mkdir -p "$T/models" "$T/ckpt" "$T/tmp" "$T/usr/local/bin" "$T/run" "$T/etc/systemd/system" "$T/etc/default" "$T/fake"
cp -r "$T/series/save_000" "$T/models/base"
for i in 1 2 3 4 5; do cp -r "$T/series/save_00$i" "$T/ckpt/step_0${i}00"; done

for tool in curl systemctl journalctl; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/fake.log"\n' "$tool" "$T" > "$T/fake/$tool"
  chmod +x "$T/fake/$tool"
done
export PATH="$bindir:$(dirname "$HFDELTA_GEN"):$T/usr/local/bin:$T/fake:$PATH"

mkdir -p "$T/work"
total=0
summary=()
for i in "${!pages[@]}"; do
  page=${pages[$i]}
  name=${page#"$repo"/}
  dir="$T/blocks/$(printf '%02d' "$i")"
  count=$(extract "$page" "$dir") || { echo "FAIL $name: cannot read its blocks"; exit 1; }
  [ "$count" -gt 0 ] || { echo "FAIL $name has no \`\`\`sh block to run"; exit 1; }
  for k in $(seq 1 "$count"); do
    b="$dir/block$(printf '%02d' "$k")"
    sed -E -e "s#(^|[ '\"=])(/models|/ckpt|/shared|/local|/tmp/hfdelta-try|/usr/local/bin|/run|/etc/systemd|/etc/default|/etc/hfdelta|/var/lib/node_exporter)#\1$T\2#g" \
           -e "s#while sleep 30; do#for _ in 1 2; do#" -e "s#(^| )contrib/#\1$repo/contrib/#g" "$b" > "$b.sh"
    if ! out=$(cd "$T/work" && bash -euo pipefail "$b.sh" 2>&1); then
      echo "FAIL $name block $k of $count:"; sed 's/^/  | /' "$b"; echo "  output:"; echo "$out" | sed 's/^/  > /'; exit 1
    fi
    echo "PASS $name block $k: $(grep -cvE '^\s*(#|$)' "$b") lines"
  done
  summary+=("$name: $count blocks")
  total=$((total + count))
done

# Where the commands leave things: the first try's local at its last save,
# /local/model pulled to the newest version, /local/other squashed to 3.
cmp_tree() { diff -r -x .weight_sync "$1" "$2" > /dev/null || { echo "FAIL $1 differs from $2"; exit 1; }; }
cmp_tree "$T/tmp/hfdelta-try/local" "$T/tmp/hfdelta-try/save_002"
cmp_tree "$T/local/model" "$T/ckpt/step_0500"
cmp_tree "$T/local/other" "$T/ckpt/step_0300"
grep -q "update_weights_from_disk" "$T/fake.log" || { echo "FAIL the --then command never called the engine"; exit 1; }
printf '%s\n' "${summary[@]}"
echo "PASS $total blocks of ${#pages[@]} pages; /local/model holds the last save, /local/other version 3"

#!/usr/bin/env bash
# The README's commands, as written, in order: every ```sh block of its
# "Usage" section and of "Crash safety" up to "Shared storage" (whose
# object-store recipe tests/object_store.sh runs against a real store), run
# from a fresh directory on generated checkpoints. Fails at the first command
# that fails, printing its block.
#
# What is not this machine's is mapped, never the commands themselves: the
# absolute paths (/models, /ckpt, /shared, /local, /usr/local/bin, /run,
# /etc/systemd, /etc/default) go below a temporary directory; curl (no engine
# here), systemctl and journalctl are stand-ins that record their arguments;
# `while sleep 30; do` runs its body twice; contrib/ is the clone's.
# Usage: readme_commands.sh README (binaries from HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_GEN)
set -euo pipefail
readme=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
repo=$(dirname "$readme")
T=$(mktemp -d /tmp/hfdelta-readme.XXXXXX)
trap 'rm -rf "$T"' EXIT
bindir=$(dirname "${HFDELTA_APPLY:?}")
[ "$(dirname "${HFDELTA_DIFF:?}")" = "$bindir" ] || { echo "delta-diff and delta-apply must be in one directory"; exit 2; }

# The checkpoints the README names: a base and five saves.
"${HFDELTA_GEN:?}" --preset tiny --saves 5 --lr 1e-5 "$T/series" > /dev/null 2>&1
mkdir -p "$T/models" "$T/ckpt" "$T/usr/local/bin" "$T/run" "$T/etc/systemd/system" "$T/etc/default" "$T/fake"
cp -r "$T/series/save_000" "$T/models/base"
for i in 1 2 3 4 5; do cp -r "$T/series/save_00$i" "$T/ckpt/step_0${i}00"; done

for tool in curl systemctl journalctl; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/fake.log"\n' "$tool" "$T" > "$T/fake/$tool"
  chmod +x "$T/fake/$tool"
done
export PATH="$bindir:$T/usr/local/bin:$T/fake:$PATH"

# The blocks, one file each, with the paths mapped.
awk '/^## Usage/{on=1} /^## Shared storage/{on=0} on && /^```sh/{c=1; n++; next} on && /^```/{c=0; next}
     on && c {print > (dir "/block" sprintf("%02d", n))}' dir="$T" "$readme"
mkdir -p "$T/work" && cd "$T/work"
n=0
for b in "$T"/block*; do
  sed -E -e "s#(^|[ '\"=])(/models|/ckpt|/shared|/local|/usr/local/bin|/run|/etc/systemd|/etc/default)#\1$T\2#g" \
         -e "s#while sleep 30; do#for _ in 1 2; do#" -e "s#(^| )contrib/#\1$repo/contrib/#g" "$b" > "$b.sh"
  n=$((n + 1))
  if ! out=$(bash -euo pipefail "$b.sh" 2>&1); then
    echo "FAIL README block $n:"; sed 's/^/  | /' "$b"; echo "  output:"; echo "$out" | sed 's/^/  > /'; exit 1
  fi
  echo "PASS README block $n: $(grep -cvE '^\s*(#|$)' "$b") lines"
done

# Where the commands leave things: /local/model pulled to the newest version, /local/other squashed to 3.
cmp_tree() { diff -r -x .weight_sync "$1" "$2" > /dev/null || { echo "FAIL $1 differs from $2"; exit 1; }; }
cmp_tree "$T/local/model" "$T/ckpt/step_0500"
cmp_tree "$T/local/other" "$T/ckpt/step_0300"
grep -q "update_weights_from_disk" "$T/fake.log" || { echo "FAIL the --then command never called the engine"; exit 1; }
echo "PASS $n README blocks; /local/model holds the last save, /local/other version 3"

#!/usr/bin/env bash
# shellcheck disable=SC2016,SC2012  # checks eval single-quoted conditions; ls on names we wrote
# Publishing through an S3 object store, the documented recipe end to end,
# against a throw-away SeaweedFS cluster (scripts/lab/storage-lab.sh) and rclone:
#
#   trainer:  delta-diff ... STAGING --post-publish "$UPLOAD"
#             STAGING is a local publication root; UPLOAD copies each version
#             directory, once delta-diff has made it durable, to
#             s3:BUCKET/root/NAME, its completion marker last.
#   host:     delta-apply --root VIEW LOCAL --require-marker --pre-read "$REFRESH"
#             VIEW is a host-local directory; REFRESH mirrors s3:BUCKET/root
#             into it (rclone sync) before delta-apply reads it.
#
# Why a synced local view rather than a read-only `rclone mount` of the bucket:
# the view is a snapshot that does not change while delta-apply reads it, so an
# upload, an overwrite or a prune in the bucket during an apply cannot make it
# read half of one state and half of another; reading it is plain local I/O,
# with no FUSE daemon per host that can hang a read or serve a stale listing.
# (Seen with rclone 1.60 on this gateway: a read-only mount does not show a new
# version for its --dir-cache-time, 5 minutes by default, unless `rclone rc
# vfs/refresh` is run first, and an object overwritten after the listing is
# read with its new bytes under the listing's old size.) An upload still in
# progress when the view is refreshed leaves a version without its marker, or
# without some of its files: delta-apply takes it as "not published yet" and
# the next pull takes it whole (the marker is uploaded last, but a reader is
# safe in any order: the marker lists every file with its size and checksum).
# The price: a host downloads every version in the bucket's root once (full
# versions too, even when a delta sidecar would do), so prune the root; a
# read-only `rclone mount` would fetch only what delta-apply reads.
# --require-marker: without it, a root where no version has its marker yet
# (the first upload still in progress) would be read as a root of versions
# without markers, and a half-uploaded first version taken as damaged (exit 3).
#
# Checks: a series with one `--full BASE NEW` version reaches two hosts
# initialised from the base, and a new host, byte-identical to the last save;
# a version uploaded without its marker, or with its marker and a file missing
# or cut short, is "not published yet" (exit 0, LOCAL unchanged) and applies
# once the upload completes; a complete version with an object overwritten by
# garbage of the same size is refused (exit 3, LOCAL unchanged) and applies
# once repaired; a failing --post-publish exits 13 (the version stays
# published in STAGING, and uploading it by hand recovers); a failing
# --pre-read exits 14, LOCAL unchanged.
#
# The first section needs only the publishing and pulling of earlier builds
# (the hooks run by hand); the rest needs --post-publish, --pre-read,
# --require-marker and --full: without them it is skipped and the test exits
# 77 (meson's "skipped") after the first section, saying so.
#
# Environment: HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_GEN (the binaries; meson
# sets them; default those of HFDELTA_BUILDDIR, else build: build/src/delta-diff, ...); LAB_KEEP=1 keeps the work directory.
# Exit: 0 all passed, 1 a check failed, 77 skipped (weed or rclone missing, or
# the binaries lack the publishing hooks).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
# shellcheck source=scripts/lab/storage-lab.sh
. "$repo/scripts/lab/storage-lab.sh"
lab_tools "$repo"

t_start=$SECONDS
passed=0 failed=0 skipped=0
check() { # check DESCRIPTION COMMAND...: PASS if COMMAND succeeds
  local what=$1; shift
  if "$@"; then echo "PASS: $what"; passed=$((passed + 1))
  else echo "FAIL: $what"; failed=$((failed + 1)); fi
}
skip() { echo "SKIP: $*"; skipped=$((skipped + 1)); }
summary() {
  echo "object_store: $passed passed, $failed failed, $skipped skipped, $((SECONDS - t_start)) s"
}

# Nothing to run without these: say why and let meson report a skip.
if ! reasons=$(lab_require weed rclone); then echo "$reasons"; exit 77; fi
for b in "$DIFF" "$APPLY" "$GEN"; do
  [ -x "$b" ] || { echo "object_store: $b is not built"; exit 1; }
done
new_cli=1
for f in --post-publish --full; do "$DIFF" --help | grep -- "$f" > /dev/null || new_cli=0; done
for f in --pre-read --require-marker; do "$APPLY" --help | grep -- "$f" > /dev/null || new_cli=0; done

lab_init hfdelta-object-store
T=$LAB_DIR
lab_server_start 127.0.0.1
lab_rclone_remote s3
BUCKET=models
lab_bucket s3 "$BUCKET"
# A second remote where nothing listens, for the failing hooks.
dead_port=$(lab_free_ports 1)
export RCLONE_CONFIG_DEAD_TYPE=s3 RCLONE_CONFIG_DEAD_PROVIDER=Other RCLONE_CONFIG_DEAD_ENV_AUTH=false
export RCLONE_CONFIG_DEAD_ENDPOINT=http://127.0.0.1:$dead_port
export RCLONE_CONFIG_DEAD_ACCESS_KEY_ID=x RCLONE_CONFIG_DEAD_SECRET_ACCESS_KEY=y
# A few quick retries (a loaded gateway drops a request now and then), not rclone's minutes.
export RCLONE_RETRIES=3 RCLONE_LOW_LEVEL_RETRIES=3 RCLONE_CONTIMEOUT=5s RCLONE_TIMEOUT=30s

# The hooks, as a trainer and a host would write them. delta-diff and
# delta-apply run them with /bin/sh; their output goes to stderr so that stdout
# stays the --json summary. UPLOAD copies every file but the marker, then the
# marker (an rclone copy of one version directory; the include filter copies
# nothing, without error, where there is no marker).
upload_cmd() { # upload_cmd REMOTE
  echo "rclone copy --exclude hfdelta_complete.json \"\$HFDELTA_VERSION_PATH\" \"$1:$BUCKET/root/\$HFDELTA_NAME\" >&2 &&
        rclone copy --include hfdelta_complete.json \"\$HFDELTA_VERSION_PATH\" \"$1:$BUCKET/root/\$HFDELTA_NAME\" >&2"
}
refresh_cmd() { # refresh_cmd REMOTE
  echo "mkdir -p \"\$HFDELTA_ROOT\" && rclone sync --fast-list \"$1:$BUCKET/root\" \"\$HFDELTA_ROOT\" >&2"
}
UPLOAD=$(upload_cmd s3)
REFRESH=$(refresh_cmd s3)

# Test data: a base and six saves of a tiny bf16 model in three shards.
echo "== generating saves in $T/series"
"$GEN" --preset tiny --saves 6 --max-shard-size 700KB --threads 2 "$T/series" > /dev/null 2>&1
save() { printf '%s/series/save_%03d' "$T" "$1"; }
STAGING=$T/staging
mkdir -p "$STAGING"

# JSON helpers (python3 is there wherever meson is).
jfield() { # jfield FIELD < JSON (last line starting with '{'): the value, lists space-separated
  python3 -c '
import json, sys
lines = [l for l in sys.stdin.read().splitlines() if l.startswith("{")]
v = json.loads(lines[-1]).get(sys.argv[1]) if lines else None
if isinstance(v, list): v = " ".join(map(str, v))
print("" if v is None else v)' "$1"
}
state_version() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$1/.weight_sync/state.json" 2>/dev/null || echo none; }
same_as() { diff -r --exclude=.weight_sync "$1" "$2" > /dev/null; }

# pull HOST [OPTIONS...]: delta-apply --root HOST's view into HOST's LOCAL with
# the refresh hook (unless OPTIONS give another); sets rc and out.
pull() {
  local h=$1; shift
  local pre=(--pre-read "$REFRESH")
  [[ " $* " != *" --pre-read "* ]] || pre=()
  rc=0
  out=$("$APPLY" --json --require-marker --root "$T/$h/view" "${pre[@]}" "$@" "$T/$h/local") || rc=$?
  echo "   $h: rc=$rc $(jfield to_version <<<"$out" 2>/dev/null | sed 's/^/to_version=/') $(jfield waiting_for <<<"$out" 2>/dev/null)"
}
# publish [delta-diff ARGS...]: into STAGING with the upload hook; sets rc and out.
publish() {
  rc=0
  out=$("$DIFF" --json --post-publish "$UPLOAD" "$@") || rc=$?
  echo "   delta-diff $*: rc=$rc"
}
# run_hook CMD VERSION_DIR: a hook by hand, with the environment delta-diff gives it.
run_hook() {
  HFDELTA_VERSION_PATH=$2 HFDELTA_NAME=$(basename "$2") HFDELTA_ROOT=$(dirname "$2") \
    HFDELTA_VERSION=$(basename "$2" | sed 's/.*_v//') /bin/sh -c "$1"
}

for h in h1 h2; do "$APPLY" -q --init "$(save 0)" "$T/$h/local"; done

echo "== 1. transport: a delta published and uploaded, pulled through a synced view (hooks run by hand)"
"$DIFF" -q "$(save 0)" "$(save 1)" "$STAGING/weight_v000001"
check "upload of weight_v000001 (the upload hook, by hand)" run_hook "$UPLOAD" "$STAGING/weight_v000001"
check "the bucket holds every file of weight_v000001" \
  test "$(rclone lsf "s3:$BUCKET/root/weight_v000001" | sort)" = "$(ls "$STAGING/weight_v000001" | sort)"
for h in h1 h2; do
  check "$h: refresh of its view (the refresh hook, by hand)" \
    env HFDELTA_ROOT="$T/$h/view" HFDELTA_LOCAL="$T/$h/local" /bin/sh -c "$REFRESH"
  rc=0; "$APPLY" -q --root "$T/$h/view" "$T/$h/local" || rc=$?
  check "$h: delta-apply --root of the view exits 0" test "$rc" = 0
  check "$h: LOCAL at version 000001, byte-identical to save 1" \
    eval '[ "$(state_version "$T/$h/local")" = 000001 ] && same_as "$(save 1)" "$T/$h/local"'
done

if [ "$new_cli" = 0 ]; then
  skip "sections 2-6: $DIFF or $APPLY lacks --post-publish, --full, --pre-read or --require-marker (built before them)"
  summary
  [ "$failed" = 0 ] || exit 1
  exit 77
fi

echo "== 2. the recipe: --post-publish uploads, --pre-read refreshes; a --full BASE NEW version; a new host"
publish "$(save 1)" "$(save 2)" "$STAGING"
check "v2: delta-diff --post-publish exits 0" test "$rc" = 0
for h in h1 h2; do
  pull "$h"
  check "$h: pull of v2 exits 0 at version 000002, identical to save 2" \
    eval '[ "$rc" = 0 ] && [ "$(state_version "$T/$h/local")" = 000002 ] && same_as "$(save 2)" "$T/$h/local"'
done
publish --full "$(save 2)" "$(save 3)" "$STAGING"
check "v3: delta-diff --full BASE NEW --post-publish exits 0" test "$rc" = 0
check "v3: the bucket holds delta_v000003 and weight_v000003, each with its marker" eval '
  rclone lsf "s3:$BUCKET/root/delta_v000003" | grep -x hfdelta_complete.json > /dev/null &&
  rclone lsf "s3:$BUCKET/root/weight_v000003" | grep -x hfdelta_complete.json > /dev/null'
full3=$(du -sb "$(save 3)" | cut -f1)
pull h1
h1_bytes=$(jfield delta_bytes <<<"$out"); h1_side=$(jfield sidecars_applied <<<"$out")
echo "   h1 (one version behind): delta_bytes=$h1_bytes sidecars_applied=$h1_side full_copied=$(jfield full_copied <<<"$out") (the full save is $full3 bytes)"
check "h1: pull of v3 exits 0 at version 000003, identical to save 3" \
  eval '[ "$rc" = 0 ] && [ "$(state_version "$T/h1/local")" = 000003 ] && same_as "$(save 3)" "$T/h1/local"'
check "h1 (at v2) applied the delta sidecar, not the full copy ($h1_bytes bytes < $full3)" \
  eval '[ -n "$h1_bytes" ] && [ "$h1_bytes" -gt 0 ] && [ "$h1_bytes" -lt "$full3" ]'
mkdir "$T/h3" "$T/h3/local"   # a new host: an empty LOCAL
pull h3
echo "   h3 (new host): full_copied=$(jfield full_copied <<<"$out") root_bytes=$(jfield root_bytes <<<"$out")"
check "h3 (new, empty LOCAL): pull exits 0 at version 000003, identical to save 3" \
  eval '[ "$rc" = 0 ] && [ "$(state_version "$T/h3/local")" = 000003 ] && same_as "$(save 3)" "$T/h3/local"'
# h2 stays at v2 for now: it later pulls v3 and v4 in one run.

echo "== 3. a version uploaded in part is not published yet"
"$DIFF" -q "$(save 3)" "$(save 4)" "$STAGING"   # published in STAGING, uploaded by hand below
v4=$STAGING/weight_v000004
dest4=s3:$BUCKET/root/weight_v000004
data4=$(cd "$v4" && ls -S -- *.safetensors | head -1)   # its largest delta file
# not_yet HOST VERSION WHY: a pull that must leave LOCAL at VERSION, saying v4 is not published yet.
not_yet() {
  local h=$1 v=$2 why=$3
  pull "$h"
  check "$why: $h exits 0, says 000004 is not published yet, LOCAL stays at $v" eval '
    [ "$rc" = 0 ] && [ "$(jfield not_published_yet <<<"$out")" = 000004 ] &&
    [ "$(state_version "$T/$h/local")" = "$v" ] && same_as "$(save $((10#$v)))" "$T/$h/local"'
}
rclone copy --exclude hfdelta_complete.json "$v4" "$dest4"
not_yet h1 000003 "every file but the marker"
not_yet h2 000003 "every file but the marker (h2 pulls v3 meanwhile)"
check "h2 took v3 (the delta sidecar) while v4 waits" same_as "$(save 3)" "$T/h2/local"
rclone deletefile "$dest4/$data4"
rclone copy --include hfdelta_complete.json "$v4" "$dest4"
not_yet h1 000003 "marker, $data4 missing"
head -c $(($(stat -c %s "$v4/$data4") / 2)) "$v4/$data4" > "$T/half"
rclone copyto "$T/half" "$dest4/$data4"
not_yet h1 000003 "marker, $data4 cut to half its size"
rclone copyto "$v4/$data4" "$dest4/$data4"
for h in h1 h2 h3; do
  pull "$h"
  check "upload complete: $h pulls v4, identical to save 4" \
    eval '[ "$rc" = 0 ] && [ "$(state_version "$T/$h/local")" = 000004 ] && same_as "$(save 4)" "$T/$h/local"'
done

echo "== 4. a complete version with an object overwritten by garbage of the same size"
publish "$(save 4)" "$(save 5)" "$STAGING"
check "v5: delta-diff --post-publish exits 0" test "$rc" = 0
v5=$STAGING/weight_v000005
data5=$(cd "$v5" && ls -S -- *.safetensors | head -1)
head -c "$(stat -c %s "$v5/$data5")" /dev/urandom > "$T/garbage"
rclone copyto "$T/garbage" "s3:$BUCKET/root/weight_v000005/$data5"
pull h1
check "garbage in $data5: h1 exits 3, LOCAL stays at 000004, unchanged" \
  eval '[ "$rc" = 3 ] && [ "$(state_version "$T/h1/local")" = 000004 ] && same_as "$(save 4)" "$T/h1/local"'
echo "== 5. a failing --pre-read (the object store unreachable)"
pull h2 --pre-read "$(refresh_cmd dead)"
check "--pre-read fails: h2 exits 14, LOCAL stays at 000004, unchanged" \
  eval '[ "$rc" = 14 ] && [ "$(state_version "$T/h2/local")" = 000004 ] && same_as "$(save 4)" "$T/h2/local"'
rclone copyto "$v5/$data5" "s3:$BUCKET/root/weight_v000005/$data5"   # repaired
for h in h1 h2 h3; do
  pull "$h"
  check "repaired: $h pulls v5, identical to save 5" \
    eval '[ "$rc" = 0 ] && [ "$(state_version "$T/$h/local")" = 000005 ] && same_as "$(save 5)" "$T/$h/local"'
done

echo "== 6. a failing --post-publish (the object store unreachable)"
rc=0; out=$("$DIFF" --json --post-publish "$(upload_cmd dead)" "$(save 5)" "$(save 6)" "$STAGING") || rc=$?
echo "   delta-diff --post-publish (dead remote): rc=$rc"
check "upload fails: delta-diff exits 13, weight_v000006 stays published in STAGING" \
  eval '[ "$rc" = 13 ] && [ -f "$STAGING/weight_v000006/hfdelta_complete.json" ]'
pull h1
check "nothing uploaded: h1 stays at 000005" eval '[ "$rc" = 0 ] && [ "$(state_version "$T/h1/local")" = 000005 ]'
check "recovery: the upload hook run by hand" run_hook "$UPLOAD" "$STAGING/weight_v000006"
for h in h1 h2 h3; do
  pull "$h"
  check "$h pulls v6, identical to the last save" \
    eval '[ "$rc" = 0 ] && [ "$(state_version "$T/$h/local")" = 000006 ] && same_as "$(save 6)" "$T/$h/local"'
done

summary
[ "$failed" = 0 ]

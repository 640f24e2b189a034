#!/usr/bin/env bash
# The library's layers (src/LAYER/, one folder each), lowest first. A file
# may include headers of its own layer and of the layers listed for it,
# never of a layer above, so the layers depend on each other without a
# cycle. A public header (include/hfdelta/NAME.hpp) belongs to the layer of
# src/*/NAME.cpp, or is listed in header_layer. A source file includes its
# own header first. cuda/, the CUDA path, is the top layer (its own folder,
# built only with nvcc), and it names its own headers without a folder. The
# front-ends (src/cli, python/src) include the library through
# include/hfdelta only, and their own folder's headers; python/src also the
# CUDA path's publisher (cuda/device_publisher.hpp), which has no public
# header: the package is its one user.
#
# usage: check_layers.sh [SOURCE_ROOT]   exit 1 naming each include that breaks a rule
set -u
cd "${1:-.}" || exit 2

layers=(util format codec delta root store diff apply publish fleet frontend cuda)
declare -A may=(
  [util]=""                                                      # errors, files, hashes, signals, progress, threads
  [format]="util"                                                # safetensors, checkpoints, version names, completion markers
  [codec]="util format"                                          # the entry encodings
  [delta]="util format codec"                                    # delta directories: index, reader, writer; squash, inspect
  [root]="util format codec delta"                               # the publication root as its readers see it
  [store]="util format codec delta"                              # LOCAL's state, checksum records, journal
  [diff]="util format codec delta"                               # delta-diff: the tensor encoder, the base check
  [apply]="util format codec delta root store"                   # delta-apply: plan, execute, init, pull, verify
  [publish]="util format codec delta root store diff apply"      # full versions, publishers, mirror, withdraw, prune
  [fleet]="util format codec delta root store diff apply"        # host reports, the fleet view, peers
  [frontend]="util format codec delta root store diff apply publish fleet"  # what the front-ends share: --json, metrics, option rules
  [cuda]="util format codec delta root store diff apply publish fleet"      # the CUDA path: changes found on the GPU, its publisher
)
declare -A header_layer=([error]=util [found]=codec [region]=delta)  # public headers without a NAME.cpp

bad=0
complain() {
  echo "check_layers: $*" >&2
  bad=1
}

# The folder of LAYER's files.
layer_dir() { if [[ $1 == cuda ]]; then echo cuda; else echo "src/$1"; fi; }

is_layer() {
  local l
  for l in "${layers[@]}"; do [[ $l == "$1" ]] && return 0; done
  return 1
}

# The layer holding internal header FILE (src/LAYER/FILE), if any.
internal_layer() {
  local l
  for l in "${layers[@]}"; do [[ -e $(layer_dir "$l")/$1 ]] && echo "$l"; done
}

# The layer of public header NAME (hfdelta/NAME.hpp).
public_layer() {
  local name=$1
  if [[ -n ${header_layer[$name]:-} ]]; then
    echo "${header_layer[$name]}"
    return
  fi
  internal_layer "$name.cpp"
}

# check FILE LAYER: every include of FILE is of LAYER or one it may include.
check() {
  local file=$1 layer=$2 line inc target
  while IFS= read -r line; do
    inc=${line#*\"}
    inc=${inc%%\"*}
    case $inc in
      hfdelta/*.hpp)
        target=$(public_layer "$(basename "$inc" .hpp)")
        if [[ -z $target ]]; then
          complain "$file: includes $inc, which belongs to no layer (add src/LAYER/$(basename "$inc" .hpp).cpp or list it in header_layer)"
          continue
        fi
        ;;
      */*)
        target=${inc%%/*}
        if ! is_layer "$target"; then
          complain "$file: includes $inc, of no layer"
          continue
        fi
        ;;
      *)
        if [[ $layer == cuda && -e cuda/$inc ]]; then
          target=cuda
        else
          complain "$file: includes \"$inc\"; name a library header by its layer (\"LAYER/$inc\") or as \"hfdelta/...\""
          continue
        fi
        ;;
    esac
    [[ $target == "$layer" || " ${may[$layer]} " == *" $target "* ]] ||
      complain "$file ($layer) includes $inc ($target): a layer may include only its own and lower ones (${may[$layer]:-none})"
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file")
}

for dir in src/*/; do
  layer=$(basename "$dir")
  [[ $layer == cli || $layer == cuda ]] || is_layer "$layer" || complain "src/$layer/: not a layer (${layers[*]})"
done
for file in src/*.cpp src/*.hpp; do
  [[ -e $file ]] && complain "$file: directly in src/; put it in the folder of its layer"
done

for layer in "${layers[@]}"; do
  dir=$(layer_dir "$layer")
  for file in "$dir"/*.cpp "$dir"/*.hpp "$dir"/*.cu; do
    [[ -e $file ]] && check "$file" "$layer"
  done
  # A source file includes its own header first, so that the header is
  # seen to stand on its own.
  for file in "$dir"/*.cpp; do
    [[ -e $file ]] || continue
    name=$(basename "$file" .cpp)
    own=
    [[ -e include/hfdelta/$name.hpp ]] && own=hfdelta/$name.hpp
    [[ -e $dir/$name.hpp ]] && own=$layer/$name.hpp
    [[ $layer == cuda && -e $dir/$name.hpp ]] && own=$name.hpp
    first=$(grep -m1 -E '^[[:space:]]*#[[:space:]]*include' "$file")
    [[ -z $own || $first == *"\"$own\""* ]] || complain "$file: includes $own after $first; its own header comes first"
  done
done
for file in include/hfdelta/*.hpp; do
  layer=$(public_layer "$(basename "$file" .hpp)")
  if [[ -z $layer ]]; then
    complain "$file: belongs to no layer (add src/LAYER/$(basename "$file" .hpp).cpp or list it in header_layer)"
    continue
  fi
  check "$file" "$layer"
  # What users include stands on the public headers alone: they have no src/.
  while IFS= read -r line; do
    inc=${line#*\"}
    inc=${inc%%\"*}
    [[ $inc == hfdelta/*.hpp ]] || complain "$file: includes \"$inc\"; a public header includes only public ones (include/hfdelta/)"
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file")
done

# The front-ends: public headers, their own folder's, and for python/src the
# CUDA path's publisher.
for file in src/cli/*.cpp src/cli/*.hpp python/src/*.cpp python/src/*.hpp; do
  [[ -e $file ]] || continue
  while IFS= read -r line; do
    inc=${line#*\"}
    inc=${inc%%\"*}
    [[ $inc == hfdelta/*.hpp && -e include/$inc ]] && continue
    [[ $inc != */* && -e $(dirname "$file")/$inc ]] && continue
    [[ $file == python/src/* && $inc == device_publisher.hpp ]] && continue
    complain "$file: includes \"$inc\", not a public header nor one of its folder; a front-end takes the library through include/hfdelta"
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file")
done

# An error about a file names it as the error's path (fail(code, path,
# problem)), not as the first words of its message, which --json and Python
# would not see.
while IFS= read -r hit; do
  complain "$hit: an error whose message starts with a path: give the path as fail(code, PATH, PROBLEM)"
done < <(grep -rnE 'fail\([^,]+,[[:space:]]*\(?[^",]*\.string\(\)[[:space:]]*\+[[:space:]]*": ' src python/src tools cuda || true)

if ((bad == 0)); then
  echo "check_layers: ${layers[*]}: no include reaches up a layer"
fi
exit $bad

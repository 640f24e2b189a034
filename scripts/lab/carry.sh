# Sourced by the scripts that pack programs built here for the device machine,
# which has no build dependencies (gpu-check.sh, device-python.sh,
# bench/thread-scaling.sh). Run from the repository root.

# carry_libs DEST PROGRAM...: the shared libraries PROGRAMs load beyond libc,
# libm and the C++ runtime (which every Linux there has), copied into DEST.
carry_libs() {
  local dest=$1 lib
  shift
  mkdir -p "$dest"
  for x in "$@"; do ldd "$x"; done | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libstdc++.so* | libgcc_s.so*) ;;
      *) cp -L "$lib" "$dest/" ;;
    esac
  done
}

# carry_ignored DIR: DIR (at the repository root) ignored by git here, so that
# it travels only when a device call carries it.
carry_ignored() {
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx "/$1/" "$exclude" 2>/dev/null || echo "/$1/" >>"$exclude"
}

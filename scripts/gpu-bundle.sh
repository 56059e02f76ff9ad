#!/usr/bin/env bash
# Packs built moeplan binaries to run on a GPU machine that has the CUDA
# toolkit (cudart, cuBLAS, NCCL) but not this build's Debian packages: the
# binaries, every shared library they load except glibc, libstdc++ and the
# CUDA libraries (the GPU machine's own are used), and Open MPI's plugins,
# help texts and settings (for singleton runs, without mpirun).
#
#   scripts/gpu-bundle.sh BUILD_DIR OUT_DIR [BINARY...]
#   # on the GPU machine:
#   source OUT_DIR/env.sh && OUT_DIR/bin/executor_cuda_test
#
# BINARY paths are relative to BUILD_DIR (default: the CUDA test,
# moeplan-exec and moeplan-profile). env.sh finds the CUDA libraries under
# $CUDA_HOME (default /usr/local/cuda) or, failing that, in Python's
# nvidia-* wheels.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
build=$1
out=$2
shift 2
bins=("$@")
if [[ ${#bins[@]} -eq 0 ]]; then
  bins=(tests/executor_cuda_test executor/moeplan-exec profiler/moeplan-profile)
fi

ompi_pkglib=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
ompi_pkgdata=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed -n 's/^path:pkgdatadir://p')
ompi_sysconf=$(ompi_info --path sysconfdir --parsable 2>/dev/null | sed -n 's/^path:sysconfdir://p')
for d in "$ompi_pkglib" "$ompi_pkgdata" "$ompi_sysconf"; do
  [[ -n $d && -d $d ]] || { echo "gpu-bundle: ompi_info names no Open MPI folder ('$d')" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/ompi"
for b in "${bins[@]}"; do
  [[ -x $build/$b ]] || { echo "gpu-bundle: $build/$b is not a built program" >&2; exit 1; }
  strip --strip-debug -o "$out/bin/$(basename "$b")" "$build/$b"
done
# Open MPI's plugins, less the fabric transports (a singleton or one host
# needs shared memory and TCP only) and the OpenSHMEM layer.
cp -r "$ompi_pkglib" "$out/ompi/pkglib"
rm -f "$out"/ompi/pkglib/mca_{btl_ofi,btl_openib,mtl_ofi,mtl_psm,mtl_psm2,pml_ucx,osc_ucx,atomic_ucx,spml_*,sshmem_*,memheap_*,scoll_*}.so
cp -r "$ompi_pkgdata" "$out/ompi/pkgdata"
cp -r "$ompi_sysconf" "$out/ompi/etc"

# Libraries the GPU machine provides itself (its glibc and C++ runtime are
# newer than this build's, so they load what was linked here).
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-.*)\.so'
ldd "$out"/bin/* "$out"/ompi/pkglib/*.so 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r name path; do
    [[ $name =~ $skip ]] && continue
    strip --strip-unneeded -o "$out/lib/$name" "$path"
  done

cat >"$out/env.sh" <<'EOF'
# Sourced on the GPU machine: libraries, Open MPI's folders, singleton mode.
_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_cuda=()
for _d in "${CUDA_HOME:-/usr/local/cuda}"/lib64 "${CUDA_HOME:-/usr/local/cuda}"/lib; do
  [[ -d $_d ]] && _cuda+=("$_d")
done
# NCCL (and, where the toolkit has none, cuBLAS) from Python's nvidia wheels.
for _lib in libnccl.so.2 libcublas.so.13 libcudart.so.13; do
  _found=
  for _d in "${_cuda[@]}"; do [[ -e $_d/$_lib ]] && _found=$_d; done
  if [[ -z $_found ]]; then
    _p=$(find / -xdev -name "$_lib" -path '*nvidia*' 2>/dev/null | head -1)
    [[ -n $_p ]] && _cuda+=("$(dirname "$_p")")
  fi
done
export LD_LIBRARY_PATH="$_b/lib$(printf ':%s' "${_cuda[@]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$_b/bin:$PATH"
export OPAL_PKGLIBDIR="$_b/ompi/pkglib" OPAL_PKGDATADIR="$_b/ompi/pkgdata" OPAL_SYSCONFDIR="$_b/ompi/etc"
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
unset _b _cuda _d _lib _found _p
EOF
du -sh "$out" | awk '{print "gpu-bundle: " $1 " in " "'"$out"'"}'

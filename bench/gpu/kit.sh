#!/usr/bin/env bash
# Builds what the GPU checks run and packs it, with the shared libraries a bare CUDA
# machine may lack, into one folder that travels to a lent GPU machine (the `device`
# tool's `carry`): bench/gpu/device.sh then runs everything from it.
#
#   bench/gpu/kit.sh [--no-mpi] [DIR]   (default .devkit, which .git/info/exclude should ignore)
#
# It also packs DIR into DIR.txz (xz): the binaries take about 84 MB, over the 64 MiB the
# device tool carries, and about 12 MB packed; carry DIR.txz and unpack it there first
# (`tar -xJf .devkit.txz && bash bench/gpu/device.sh .devkit $OUT ...`).
#
# --no-mpi leaves OpenMPI out (DIR/mpilib, DIR/root: 24 MB of the 64 MiB the device tool
# carries) for a machine known to have its own OpenMPI 4.1 (the lent H100/H200 image
# has 4.1.6); device.sh says so when neither is there.
#
# DIR/bin      meshplan, the gpu-tagged test binaries and the benchmarks, linked with our
#              own libraries static (--dynamic_mode=off), so only system libraries remain
# DIR/lib      every non-glibc, non-CUDA, non-MPI shared library those need (cJSON,
#              SQLite, ...), found with ldd; CUDA's own (cudart, cuBLASLt, NCCL) come from
#              the machine, which has a CUDA 13 toolkit
# DIR/mpilib   OpenMPI 4.1 (libmpi.so.40) and its dependencies, and DIR/root Debian's
#              OpenMPI runtime at its absolute paths (mpirun/orted, the plugin folder, help
#              texts, the MCA config): device.sh uses them only where the machine has no
#              libmpi.so.40 of its own (an Ubuntu 24.04 image ships OpenMPI 4.1.6, whose
#              plugins must not meet Debian's libpmix)
# DIR/data     the model, GPU and cluster files the binaries read by path
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
with_mpi=1
if [ "${1:-}" = "--no-mpi" ]; then with_mpi=0; shift; fi
out=${1:-.devkit}
# every GoogleTest target tagged gpu (sh_tests run their scripts from the tree instead)
gpu_tests=$(bazel query 'kind(cc_test, attr(tags, "\bgpu\b", tests(//...)))' 2>/dev/null)
bazel build --dynamic_mode=off //app:meshplan //bench:kernels_bench //bench:attention_bench $gpu_tests >/dev/null
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/mpilib" "$out/root"
cp -L bazel-bin/app/meshplan bazel-bin/bench/kernels_bench bazel-bin/bench/attention_bench "$out/bin/"
for t in $gpu_tests; do # //tests/x:y -> bazel-bin/tests/x/y
  p=${t#//}
  cp -L "bazel-bin/${p%%:*}/${p##*:}" "$out/bin/"
done
chmod u+w "$out"/bin/*
strip --strip-debug "$out"/bin/* # the working tree that travels is capped at 64 MiB
for f in $(cd data && find . -name "*.json"); do mkdir -p "$out/data/$(dirname "$f")"; cp "data/$f" "$out/data/$f"; done

skip='^(linux-vdso|ld-linux|libstdc\+\+|libgcc_s|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libcuda\.so|libcudart|libcublas|libnccl|libcudnn|libnvidia)'
mpi='^(libmpi|libopen-|libpmix|libhwloc|libevent|libmca_|liboshmem|libuc[mpst]|libfabric|libpsm|libibverbs|librdmacm|libefa|libnl-|libinfinipath|libnuma|libmunge|libudev)'
collect() { # every shared library the given files need, but glibc's and CUDA's
  ldd "$@" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    dir=lib
    [[ $name =~ $mpi ]] && dir=mpilib
    [ -e "$out/$dir/$name" ] || cp -L "$path" "$out/$dir/$name"
  done
}
collect "$out"/bin/*
pack() { # DIR.txz beside DIR, written under a temporary name and renamed
  tar -cf - -C "$(dirname "$out")" "$(basename "$out")" | xz -T2 -6 >"$out.txz.tmp"
  mv "$out.txz.tmp" "$out.txz"
  du -sh "$out" "$out.txz"
}
if [ $with_mpi -eq 0 ]; then
  rm -rf "$out/mpilib" "$out/root"
  pack
  exit 0
fi
# OpenMPI: the launcher, the daemon, the plugin folder and what they all link.
ompi=/usr/lib/x86_64-linux-gnu/openmpi
mkdir -p "$out/root/usr/bin" "$out/root$ompi" "$out/root/usr/share" "$out/root/etc"
cp -L /usr/bin/orterun /usr/bin/orted "$out/root/usr/bin/"
ln -sf orterun "$out/root/usr/bin/mpirun"
cp -rL "$ompi/lib" "$out/root$ompi/"
cp -rL /usr/share/openmpi "$out/root/usr/share/"
cp -rL /etc/openmpi "$out/root/etc/"
collect /usr/bin/orterun /usr/bin/orted "$ompi"/lib/*.so* "$ompi"/lib/openmpi3/*.so
pack

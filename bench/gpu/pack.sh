#!/usr/bin/env bash
# Pack what the GPU checks run into one small folder that can travel to a GPU
# machine which has the NVIDIA driver, CUDA and NCCL but none of our other
# libraries (PMIx, UCX, libyaml, xxhash, ...): the real binaries (not
# libtool's wrappers, which name this build's absolute path), libnereus, and
# every shared library they load except glibc's, the C++ runtime, the CUDA
# driver and NCCL (218 MB here; the GPU machine has its own, found by
# device-check.sh). Builds nothing.
#
#   bench/gpu/pack.sh BUILD_DIR DEST
#
# BUILD_DIR: configured --with-cuda, after `make && make check TESTS= &&
# make bench/gpu/gpu_bench`. DEST is made (emptied first); a few MiB.
# Layout: DEST/tests/mp/{mp_nccl,pmix_srv,mp_worker}, DEST/bench/gpu/gpu_bench,
# DEST/lib/ (libraries; PMIx plugins in DEST/lib/pmix, UCX's shared-memory
# module in DEST/lib/ucx), DEST/PACKED (what). mp_worker (built with UCX)
# lets device-check.sh run the worker API once on GPU memory.
set -eu
if [ $# -ne 2 ] || [ "$1" = --help ]; then
    awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; [ "${1:-}" = --help ]; exit
fi
B=$(cd "$1" && pwd)
D="$2"
real() { # the ELF behind a libtool wrapper, or the file itself
    local d f
    d=$(dirname "$1"); f=$(basename "$1")
    if [ -f "$d/.libs/$f" ]; then echo "$d/.libs/$f"; else echo "$1"; fi
}
bins="tests/mp/mp_nccl bench/gpu/gpu_bench tests/mp/pmix_srv"
for b in $bins; do
    [ -e "$B/$b" ] || { echo "pack.sh: no $B/$b (make check TESTS= && make bench/gpu/gpu_bench)" >&2; exit 1; }
done
[ -e "$B/tests/mp/mp_worker" ] && bins="$bins tests/mp/mp_worker"
rm -rf "$D"
mkdir -p "$D/tests/mp" "$D/bench/gpu" "$D/lib"
for b in $bins; do cp -L "$(real "$B/$b")" "$D/$b"; done
cp -L "$B"/.libs/libnereus.so.0 "$D/lib/"
# Dependencies as this machine resolves them, minus what every Linux with a
# GPU driver has (or must bring itself: libcuda, NCCL).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libnccl\.so)'
for f in "$D/lib/libnereus.so.0" $(for b in $bins; do echo "$D/$b"; done); do
    LD_LIBRARY_PATH="$B/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$f"
done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
    if ! echo "$name" | grep -Eq "$skip"; then cp -L "$path" "$D/lib/$name"; fi
done
for d in /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix /usr/lib/pmix2/lib/pmix; do
    if [ -d "$d" ]; then cp -rL "$d" "$D/lib/pmix"; break; fi
done
# UCX loads transports beyond sm/tcp as modules: CMA (shared-memory zero copy).
for f in /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0; do
    if [ -e "$f" ]; then mkdir -p "$D/lib/ucx"; cp -L "$f" "$D/lib/ucx/"; fi
done
{
    echo "packed from $B on $(hostname) at $(date -u +%FT%TZ)"
    echo "binaries: $bins"
    echo "libraries:"; ls -1 "$D/lib"
} >"$D/PACKED"
echo "pack.sh: $D ($(du -sh "$D" | cut -f1)): $(ls "$D/lib" | wc -l) libraries"

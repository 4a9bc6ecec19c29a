#!/bin/sh
# compare_comm.sh - fsdp.h's collectives against Open MPI, measured in the same run.
#   usage: examples/compare_comm.sh [P ...]        (default: 2 4; needs make bench bench-mpi)
# For each P it times all_gather, reduce_scatter and all_reduce (f32) at 4 KiB, 1 MiB and
# 64 MiB with: fsdp.h shm (buffers from malloc, and from fsdp_comm_alloc, which peers read
# directly), Open MPI with its default shared-memory transport, fsdp.h socket over loopback and
# Open MPI over TCP (--mca btl self,tcp), and prints the times and the ratios.
set -eu
BUILD=${BUILD:-build}
SIZES=${SIZES:-4K,1M,64M}
[ -x "$BUILD/bench_comm" ] && [ -x "$BUILD/bench_comm_mpi" ] || { echo "run: make bench bench-mpi" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for P in ${*:-2 4}; do
    "$BUILD/bench_comm" --backend shm --nproc "$P" --sizes "$SIZES" --csv | tail -n +2 >"$tmp/shm.$P"
    "$BUILD/bench_comm" --backend shm --nproc "$P" --sizes "$SIZES" --csv --registered | tail -n +2 >"$tmp/shmreg.$P"
    mpirun -np "$P" "$BUILD/bench_comm_mpi" --backend mpi --mpi-native --sizes "$SIZES" --csv 2>/dev/null | tail -n +2 >"$tmp/ompi.$P"
    "$BUILD/bench_comm" --backend socket --nproc "$P" --sizes "$SIZES" --csv | tail -n +2 >"$tmp/socket.$P"
    mpirun -np "$P" --mca btl self,tcp "$BUILD/bench_comm_mpi" --backend mpi --mpi-native --sizes "$SIZES" --csv 2>/dev/null |
        tail -n +2 >"$tmp/ompitcp.$P"
done
printf '%-2s %-15s %9s | %9s %9s %9s %6s %6s | %9s %9s %6s\n' P op bytes "shm us" "shm-reg" "ompi us" ratio "ratio" \
    "socket us" "ompi-tcp" ratio
for P in ${*:-2 4}; do
    paste -d, "$tmp/shm.$P" "$tmp/shmreg.$P" "$tmp/ompi.$P" "$tmp/socket.$P" "$tmp/ompitcp.$P" |
        awk -F, '{ printf "%-2s %-15s %9s | %9.1f %9.1f %9.1f %5.2fx %5.2fx | %9.1f %9.1f %5.2fx\n", $2, $3, $4, $5, $12, $19,
                   $19 / $5, $19 / $12, $26, $33, $33 / $26 }'
done
echo "(time = median of the slowest rank per iteration; ratio = Open MPI time / fsdp.h time, > 1 means fsdp.h is faster;"
echo " shm-reg: send/recv buffers from fsdp_comm_alloc, read by peers directly; the first ratio is for malloc buffers)"

#!/bin/sh
# compare_comm.sh - fsdp.h's collectives against Open MPI, measured in the same run.
#   usage: examples/compare_comm.sh [P ...]        (default: 2 4; needs make bench bench-mpi)
# For each P it times all_gather, reduce_scatter and all_reduce (f32) at 4 KiB, 1 MiB and
# 64 MiB with: fsdp.h shm, Open MPI with its default shared-memory transport, fsdp.h socket
# over loopback and Open MPI over TCP (--mca btl self,tcp), and prints busbw and the ratios.
set -eu
BUILD=${BUILD:-build}
SIZES=${SIZES:-4K,1M,64M}
[ -x "$BUILD/bench_comm" ] && [ -x "$BUILD/bench_comm_mpi" ] || { echo "run: make bench bench-mpi" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for P in ${*:-2 4}; do
    "$BUILD/bench_comm" --backend shm --nproc "$P" --sizes "$SIZES" --csv | tail -n +2 >"$tmp/shm.$P"
    mpirun -np "$P" "$BUILD/bench_comm_mpi" --backend mpi --mpi-native --sizes "$SIZES" --csv 2>/dev/null | tail -n +2 >"$tmp/ompi.$P"
    "$BUILD/bench_comm" --backend socket --nproc "$P" --sizes "$SIZES" --csv | tail -n +2 >"$tmp/socket.$P"
    mpirun -np "$P" --mca btl self,tcp "$BUILD/bench_comm_mpi" --backend mpi --mpi-native --sizes "$SIZES" --csv 2>/dev/null |
        tail -n +2 >"$tmp/ompitcp.$P"
done
printf '%-2s %-15s %9s | %10s %10s %7s | %10s %10s %7s\n' P op bytes "shm us" "ompi us" ratio "socket us" "ompi-tcp" ratio
for P in ${*:-2 4}; do
    paste -d, "$tmp/shm.$P" "$tmp/ompi.$P" "$tmp/socket.$P" "$tmp/ompitcp.$P" |
        awk -F, '{ printf "%-2s %-15s %9s | %10.1f %10.1f %6.2fx | %10.1f %10.1f %6.2fx\n", $2, $3, $4, $5, $12, $12 / $5, $19, $26, $26 / $19 }'
done
echo "(time = median of the slowest rank per iteration; ratio = Open MPI time / fsdp.h time, > 1 means fsdp.h is faster)"

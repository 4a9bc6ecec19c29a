#!/bin/sh
# compare_comm.sh - fsdp.h's collectives against Open MPI, measured in the same run.
#   usage: examples/compare_comm.sh [P ...]        (default: 2 4; needs make bench bench-mpi)
# For each P it times all_gather, reduce_scatter, all_reduce and broadcast (f32) at 4 KiB, 1 MiB
# and 64 MiB (SIZES=... to change) with: fsdp.h shm with malloc buffers staged through the shared
# segment (--single-copy 0) and read by peers directly (--single-copy 1, process_vm_readv), fsdp.h
# shm with buffers from fsdp_comm_alloc (mapped by peers), Open MPI's own collectives over shared
# memory (--mca btl self,vader, with its default single-copy mechanism), fsdp.h socket over
# loopback and Open MPI over TCP (--mca btl self,tcp), and prints the times and the ratios.
set -eu
BUILD=${BUILD:-build}
SIZES=${SIZES:-4K,1M,64M}
[ -x "$BUILD/bench_comm" ] && [ -x "$BUILD/bench_comm_mpi" ] || { echo "run: make bench bench-mpi" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for P in ${*:-2 4}; do
    "$BUILD/bench_comm" --backend shm --nproc "$P" --sizes "$SIZES" --csv --single-copy 0 | tail -n +2 >"$tmp/staged.$P"
    "$BUILD/bench_comm" --backend shm --nproc "$P" --sizes "$SIZES" --csv --single-copy 1 | tail -n +2 >"$tmp/1copy.$P"
    "$BUILD/bench_comm" --backend shm --nproc "$P" --sizes "$SIZES" --csv --registered | tail -n +2 >"$tmp/shmreg.$P"
    mpirun -np "$P" --mca btl self,vader "$BUILD/bench_comm_mpi" --backend mpi --mpi-native --sizes "$SIZES" --csv 2>/dev/null |
        tail -n +2 >"$tmp/ompi.$P"
    "$BUILD/bench_comm" --backend socket --nproc "$P" --sizes "$SIZES" --csv | tail -n +2 >"$tmp/socket.$P"
    mpirun -np "$P" --mca btl self,tcp "$BUILD/bench_comm_mpi" --backend mpi --mpi-native --sizes "$SIZES" --csv 2>/dev/null |
        tail -n +2 >"$tmp/ompitcp.$P"
done
printf '%-2s %-15s %9s | %9s %9s %9s %9s | %7s %7s %7s | %9s %9s %6s\n' P op bytes "staged us" "1copy us" "shm-reg" \
    "ompi us" staged 1copy reg "socket us" "ompi-tcp" ratio
for P in ${*:-2 4}; do
    # columns of each pasted csv line: backend,P,op,bytes,median_us,... (7 per run)
    paste -d, "$tmp/staged.$P" "$tmp/1copy.$P" "$tmp/shmreg.$P" "$tmp/ompi.$P" "$tmp/socket.$P" "$tmp/ompitcp.$P" |
        awk -F, '{ printf "%-2s %-15s %9s | %9.1f %9.1f %9.1f %9.1f | %6.2fx %6.2fx %6.2fx | %9.1f %9.1f %5.2fx\n",
                   $2, $3, $4, $5, $12, $19, $26, $26 / $5, $26 / $12, $26 / $19, $33, $40, $40 / $33 }'
done
echo "(time = median of the slowest rank per iteration; ratio = Open MPI time / fsdp.h time, > 1 means fsdp.h is faster."
echo " staged, 1copy: malloc buffers staged through the shared segment (two copies) or read by peers directly"
echo " (process_vm_readv, one copy); ops under 64 KiB always stage. shm-reg: buffers from fsdp_comm_alloc, mapped"
echo " by peers. ompi: Open MPI over shared memory (btl self,vader); ompi-tcp: over TCP (btl self,tcp).)"

# fsdp.h - build, tests, benchmarks. `make help` lists the targets.
CC       ?= cc
CXX      ?= c++
MPICC    ?= mpicc
MPIRUN   ?= mpirun
OPT      ?= -O2 -g
WARN     := -Wall -Wextra -Wpedantic -Werror
CFLAGS   ?=
LDLIBS   := -lpthread -lm
BUILD    ?= build
UNITY_DIR ?= tests/unity

TESTS    := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
MPI_TESTS := test_mpi
UNIT_TESTS := $(filter-out $(MPI_TESTS),$(TESTS))
SANFLAGS ?=

.PHONY: all help test test-asan test-tsan bench bench-mpi demo clean check-deps

all: $(BUILD)/bench_comm $(BUILD)/demo_collectives

help:
	@echo "make demo        4 local ranks on shared memory (see README)"
	@echo "make test        every test; ends with 'N passed, N failed' (UNITY_DIR=... for real Unity)"
	@echo "make test-asan   the tests under AddressSanitizer + UndefinedBehaviorSanitizer"
	@echo "make test-tsan   the threaded tests under ThreadSanitizer"
	@echo "make bench       build/bench_comm (collective bandwidth, nccl-tests style)"
	@echo "make bench-mpi   build/bench_comm_mpi (the same through Open MPI; needs libopenmpi-dev)"

$(BUILD):
	@mkdir -p $(BUILD)

# Tests: one program per tests/test_*.c, linked with the Unity runner (ours or UNITY_DIR's).
$(BUILD)/unity.o: $(UNITY_DIR)/unity.c | $(BUILD)
	$(CC) -std=c99 $(OPT) $(SANFLAGS) -I$(UNITY_DIR) -c $< -o $@

$(BUILD)/test_%: tests/test_%.c fsdp.h $(BUILD)/unity.o | $(BUILD)
	$(CC) -std=c99 $(OPT) $(WARN) $(SANFLAGS) $(CFLAGS) -I. -I$(UNITY_DIR) $< $(BUILD)/unity.o -o $@ $(LDLIBS)

$(BUILD)/test_mpi: tests/test_mpi.c fsdp.h $(BUILD)/unity.o | $(BUILD)
	$(MPICC) -std=c99 $(OPT) $(WARN) -DFSDP_WITH_MPI -I. -I$(UNITY_DIR) $< $(BUILD)/unity.o -o $@ $(LDLIBS)

test: check-deps $(addprefix $(BUILD)/,$(UNIT_TESTS))
	@BUILD=$(BUILD) MPICC="$(MPICC)" MPIRUN="$(MPIRUN)" UNITY_DIR=$(UNITY_DIR) CC="$(CC)" CXX="$(CXX)" \
	    sh tests/run.sh $(UNIT_TESTS)

test-asan:
	@SKIP_MPI=1 $(MAKE) --no-print-directory test BUILD=$(BUILD)/asan OPT="-O1 -g" \
	    SANFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"

test-tsan:
	@$(MAKE) --no-print-directory $(BUILD)/tsan/test_threads BUILD=$(BUILD)/tsan OPT="-O1 -g" \
	    SANFLAGS="-fsanitize=thread"
	@BUILD=$(BUILD)/tsan NO_EXTRA_CHECKS=1 sh tests/run.sh test_threads

check-deps:
	@command -v $(CC) >/dev/null || { echo "error: no C compiler ($(CC)); sudo apt-get install build-essential"; exit 1; }

# Examples and benchmarks
$(BUILD)/bench_comm: examples/bench_comm.c fsdp.h | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

$(BUILD)/bench_comm_mpi: examples/bench_comm.c fsdp.h | $(BUILD)
	@command -v $(MPICC) >/dev/null || { echo "error: $(MPICC) not found; sudo apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(MPICC) -std=c99 -O2 $(WARN) -DFSDP_WITH_MPI -I. $< -o $@ $(LDLIBS)

$(BUILD)/demo_collectives: examples/demo_collectives.c fsdp.h | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

# Training examples: an MLP on OpenBLAS (sudo apt-get install libopenblas-dev)
BLAS_CHECK = @echo '\#include <cblas.h>' | $(CC) -E -x c - >/dev/null 2>&1 || \
	{ echo "error: <cblas.h> not found; sudo apt-get install libopenblas-dev"; exit 1; }

$(BUILD)/mlp: examples/mlp.c examples/mlp_model.h fsdp.h | $(BUILD)
	$(BLAS_CHECK)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)

$(BUILD)/bench_train: examples/bench_train.c examples/mlp_model.h fsdp.h | $(BUILD)
	$(BLAS_CHECK)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)

bench: $(BUILD)/bench_comm $(BUILD)/bench_train
bench-mpi: $(BUILD)/bench_comm_mpi

demo: check-deps $(BUILD)/mlp
	./$(BUILD)/mlp --nproc 4 --strategy full --hidden 512 --layers 4 --batch 256 --steps 60 --print-every 5

clean:
	rm -rf $(BUILD)

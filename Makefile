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

# Compile with every core unless told otherwise (your -j, or a parent make's, wins). make test
# builds its programs in a make of their own whose output comes a target at a time (-Otarget, so
# that two compilers' messages do not interleave), then runs them one at a time (tests/run.sh).
ifeq ($(MAKELEVEL),0)
ifeq ($(filter -j% j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif
endif
SYNC_OUTPUT := $(if $(filter output-sync,$(.FEATURES)),-Otarget)

TESTS    := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
MPI_TESTS := test_mpi
UNIT_TESTS := $(filter-out $(MPI_TESTS),$(TESTS))
SANFLAGS ?=

.PHONY: all help test test-asan test-tsan test-multihost test-recover test-chaos trace-picture bench-scale bench bench-mpi bench-multihost bench-torch demo demo-big demo-huge demo-recover demo-mlp demo-collectives tools fuzz clean check-deps

all: $(BUILD)/gpt $(BUILD)/distill $(BUILD)/mlp $(BUILD)/ckpt_tool $(BUILD)/trace_tool $(BUILD)/bench_comm $(BUILD)/bench_train $(BUILD)/demo_collectives

help:
	@echo "make demo        train a GPT on 4 local ranks (shared memory, FULL_SHARD), checkpoint, sample"
	@echo "make demo-big    an 85 M-parameter GPT on 4 local ranks under a per-rank memory budget 1 rank cannot meet"
	@echo "make demo-huge   a 2.4 B-parameter GPT (state 1.5x the RAM) on 4 ranks, everything offloaded to disk (OFFLOAD_DIR)"
	@echo "make demo-recover  lose a host, keep training: the GPT with --recover on 4 simulated hosts x 2, one killed and rejoined (root)"
	@echo "make demo-mlp    train an MLP on 4 local ranks"
	@echo "make test        every test; ends with 'N passed, N failed' (UNITY_DIR=... for real Unity)"
	@echo "make test-asan   the tests under AddressSanitizer + UndefinedBehaviorSanitizer"
	@echo "make test-tsan   the threaded tests under ThreadSanitizer"
	@echo "make test-multihost  ranks on several simulated hosts (network namespaces; root); then make test-recover's"
	@echo "make test-recover  in-job recovery on 4 simulated hosts: kills, a silent host, a 2|2 partition, rejoins (root)"
	@echo "make test-chaos  the GPT with random delays, yields and short socket pieces, bit for bit against unperturbed runs"
	@echo "make bench       build/bench_comm (collectives) and build/bench_train (training)"
	@echo "make build/bench_wire  the wire formats' kernels (int8, int4): GB/s per CPU level and block size, error"
	@echo "make bench-mpi   build/bench_comm_mpi (collectives through Open MPI; needs libopenmpi-dev)"
	@echo "make bench-multihost  collectives across 2 simulated hosts: hierarchical vs flat vs Open MPI, GPT (root)"
	@echo "make bench-torch the GPT against PyTorch (python3-torch) at P = 1 and 2, two model sizes"
	@echo "make bench-scale  16..256 ranks on simulated hosts: time to form a job, the GPT at 256, a kill (root)"
	@echo "make trace-picture  trace 10 steps of the GPT on 2 ranks; summary; examples/trace_gpt_p2.svg"
	@echo "make tools       build/ckpt_tool (inspect, consolidate, shard checkpoints), build/trace_tool (traces),"
	@echo "                 build/loss_plot (training runs' losses side by side: an SVG and a table)"
	@echo "make fuzz        fuzz the safetensors, index.json and handshake parsers, FUZZ_TIME seconds each (clang + libFuzzer)"
	@echo "make fuzz-index  fuzz index.json parsing (fsdp_index_parse); make fuzz-hello: the socket handshake"

$(BUILD):
	@mkdir -p $(BUILD)

# Tests: one program per tests/test_*.c, linked with the Unity runner (ours or UNITY_DIR's), and the
# helpers they share (tests/test_common.h; tests/test_mlp.h: the model of two of them).
TEST_HEADERS := tests/test_common.h tests/test_mlp.h
$(BUILD)/unity.o: $(UNITY_DIR)/unity.c | $(BUILD)
	$(CC) -std=c99 $(OPT) $(SANFLAGS) -I$(UNITY_DIR) -c $< -o $@

# fsdp.h's implementation compiled once per build directory (13 of a test program's 15 CPU seconds
# at -O2, 24 of 27 with ASan) and linked into the programs that need nothing of their own from it:
# those that guard their FSDP_IMPLEMENTATION with FSDP_TEST_IMPLEMENTATION_LINKED.
LINKED_TESTS := $(patsubst tests/%.c,%,$(shell grep -l '^\#ifndef FSDP_TEST_IMPLEMENTATION_LINKED' tests/test_*.c))
$(BUILD)/fsdp_implementation.o: tests/fsdp_implementation.c fsdp.h | $(BUILD)
	$(CC) -std=c99 $(OPT) $(WARN) $(SANFLAGS) $(CFLAGS) -I. -c $< -o $@
$(addprefix $(BUILD)/,$(LINKED_TESTS)): $(BUILD)/fsdp_implementation.o
$(addprefix $(BUILD)/,$(LINKED_TESTS)): LINKED_IMPLEMENTATION = -DFSDP_TEST_IMPLEMENTATION_LINKED $(BUILD)/fsdp_implementation.o

$(BUILD)/test_%: tests/test_%.c fsdp.h $(TEST_HEADERS) $(BUILD)/unity.o | $(BUILD)
	$(CC) -std=c99 $(OPT) $(WARN) $(SANFLAGS) $(CFLAGS) -I. -I$(UNITY_DIR) $< $(LINKED_IMPLEMENTATION) $(BUILD)/unity.o -o $@ $(LDLIBS)
# tests that read traces include examples/trace_tool.c itself
$(BUILD)/test_trace_tool $(BUILD)/test_trace: examples/trace_tool.c
$(BUILD)/test_loss_plot: examples/loss_plot.c
$(BUILD)/test_link_sample: examples/link_sample.c

$(BUILD)/test_gpt: tests/test_gpt.c examples/gpt_model.h examples/example_gemm.h examples/example_common.h fsdp.h $(TEST_HEADERS) $(BUILD)/unity.o | $(BUILD)
	$(BLAS_CHECK)
	$(CC) -std=c99 $(OPT) $(WARN) $(SANFLAGS) $(CFLAGS) -I. -I$(UNITY_DIR) $< $(LINKED_IMPLEMENTATION) $(BUILD)/unity.o -o $@ -lopenblas $(LDLIBS)

$(BUILD)/test_mpi: tests/test_mpi.c fsdp.h $(TEST_HEADERS) $(BUILD)/unity.o | $(BUILD)
	$(MPICC) -std=c99 $(OPT) $(WARN) $(CFLAGS) -DFSDP_WITH_MPI -I. -I$(UNITY_DIR) $< $(BUILD)/unity.o -o $@ $(LDLIBS)

test: check-deps
	@$(MAKE) --no-print-directory $(SYNC_OUTPUT) $(addprefix $(BUILD)/,$(UNIT_TESTS))
	@BUILD=$(BUILD) MPICC="$(MPICC)" MPIRUN="$(MPIRUN)" UNITY_DIR=$(UNITY_DIR) CC="$(CC)" CXX="$(CXX)" \
	    sh tests/run.sh $(UNIT_TESTS)

# (tests/run.sh's header, docs and example checks are make test's: no sanitizer flag reaches them,
# so here they would only run again as they ran there)
test-asan:
	@NO_EXTRA_CHECKS=1 $(MAKE) --no-print-directory test BUILD=$(BUILD)/asan OPT="-O1 -g" \
	    SANFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"

test-tsan:
	@$(MAKE) --no-print-directory $(SYNC_OUTPUT) $(BUILD)/tsan/test_threads $(BUILD)/tsan/test_offload $(BUILD)/tsan/test_trace \
	    $(BUILD)/tsan/test_async_save $(BUILD)/tsan/test_rejoin $(BUILD)/tsan/test_grad_wire BUILD=$(BUILD)/tsan OPT="-O1 -g" \
	    SANFLAGS="-fsanitize=thread"
	@BUILD=$(BUILD)/tsan NO_EXTRA_CHECKS=1 sh tests/run.sh test_threads test_offload test_trace test_async_save test_rejoin \
	    test_grad_wire

# Ranks on several "hosts" built from network, mount and UTS namespaces on this machine (root;
# without them it says why and passes nothing): tests/multihost/test_multihost.sh.
test-multihost: check-deps
	@BUILD=$(BUILD) bash tests/multihost/test_multihost.sh; s=$$?; BUILD=$(BUILD) bash tests/multihost/test_recover.sh && exit $$s

# In-job recovery (issue 38) on 4 simulated hosts x 2 ranks (root): the GPT with --recover, a host killed
# at each of 10 steps and the rendezvous's host at 4 (survivors bitwise equal, losses as without the loss;
# the same schedule twice bitwise equal), a silent host, a 2|2 partition, recovery off. About a minute.
test-recover: check-deps
	@BUILD=$(BUILD) bash tests/multihost/test_recover.sh

# The bitwise promise under perturbation: >= 200 runs of the GPT built with FSDP_CHAOS (random delays,
# yields, reorderings, short socket pieces; fsdp.h's >>chaos) against the same jobs unperturbed, every
# backend (hierarchical on namespaces as root, MPI where mpicc is) and feature: tests/chaos.sh. About
# 5 minutes on 2 cores. The campaign: examples/chaos.sh.
test-chaos: check-deps $(BUILD)/chaos/gpt
	@BUILD=$(BUILD) MPICC="$(MPICC)" MPIRUN="$(MPIRUN)" bash tests/chaos.sh

check-deps:
	@command -v $(CC) >/dev/null || { echo "error: no C compiler ($(CC)); sudo apt-get install build-essential"; exit 1; }

# Examples and benchmarks
$(BUILD)/bench_comm: examples/bench_comm.c fsdp.h | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

$(BUILD)/bench_comm_mpi: examples/bench_comm.c fsdp.h | $(BUILD)
	@command -v $(MPICC) >/dev/null || { echo "error: $(MPICC) not found; sudo apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(MPICC) -std=c99 -O2 $(WARN) -DFSDP_WITH_MPI -I. $< -o $@ $(LDLIBS)

# The wire formats' kernels: speed per level and block size beside memcpy, bytes and error
$(BUILD)/bench_wire: examples/bench_wire.c examples/example_common.h fsdp.h | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

$(BUILD)/demo_collectives: examples/demo_collectives.c fsdp.h | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

# Training examples: a GPT and an MLP on OpenBLAS (sudo apt-get install libopenblas-dev). Their
# kernels are loops the compiler vectorises: -O3 (GCC's -O2 vectorises almost nothing), and no
# errno or trap semantics for float math, which would keep exp-like loops scalar. Portable: no
# -march; the kernels pick AVX-512 / AVX2 / SSE2 at run time.
EXAMPLE_OPT ?= -O3 -fno-math-errno -fno-trapping-math
# OpenBLAS itself, not only some <cblas.h>: Debian's libblas-dev (reference BLAS) also provides
# one, without openblas_set_num_threads.
BLAS_CHECK = @printf '\043include <cblas.h>\nint main(void) { openblas_set_num_threads(1); return 0; }\n' | \
	$(CC) -x c - -o /dev/null -lopenblas >/dev/null 2>&1 || \
	{ echo "error: OpenBLAS not found (<cblas.h> with openblas_set_num_threads, -lopenblas); sudo apt-get install libopenblas-dev"; exit 1; }

$(BUILD)/gpt: examples/gpt.c examples/gpt_model.h examples/example_gemm.h examples/example_common.h fsdp.h | $(BUILD)
	$(BLAS_CHECK)
	$(CC) -std=c99 $(EXAMPLE_OPT) $(WARN) $(CFLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)

# ... with the perturbation of >>chaos compiled in (FSDP_CHAOS_SEED turns it on), for tests/chaos.sh
# and examples/chaos.sh; gpt_mpi also with the MPI bridge.
$(BUILD)/chaos/gpt: examples/gpt.c examples/gpt_model.h examples/example_gemm.h examples/example_common.h fsdp.h | $(BUILD)
	$(BLAS_CHECK)
	@mkdir -p $(BUILD)/chaos
	$(CC) -std=c99 $(EXAMPLE_OPT) $(WARN) -DFSDP_CHAOS $(CFLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)

$(BUILD)/chaos/gpt_mpi: examples/gpt.c examples/gpt_model.h examples/example_gemm.h examples/example_common.h fsdp.h | $(BUILD)
	$(BLAS_CHECK)
	@command -v $(MPICC) >/dev/null || { echo "error: $(MPICC) not found; sudo apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	@mkdir -p $(BUILD)/chaos
	$(MPICC) -std=c99 $(EXAMPLE_OPT) $(WARN) -DFSDP_CHAOS -DFSDP_WITH_MPI -I. $< -o $@ -lopenblas $(LDLIBS)

$(BUILD)/distill: examples/distill.c examples/gpt_model.h examples/example_gemm.h examples/example_common.h fsdp.h | $(BUILD)
	$(BLAS_CHECK)
	$(CC) -std=c99 $(EXAMPLE_OPT) $(WARN) $(CFLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)

$(BUILD)/mlp: examples/mlp.c examples/mlp_model.h examples/example_gemm.h examples/example_common.h fsdp.h | $(BUILD)
	$(BLAS_CHECK)
	$(CC) -std=c99 $(EXAMPLE_OPT) $(WARN) $(CFLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)

$(BUILD)/bench_train: examples/bench_train.c examples/mlp_model.h examples/gpt_model.h examples/example_gemm.h examples/example_common.h fsdp.h | $(BUILD)
	$(BLAS_CHECK)
	$(CC) -std=c99 $(EXAMPLE_OPT) $(WARN) $(CFLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)

$(BUILD)/ckpt_tool: examples/ckpt_tool.c fsdp.h | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

$(BUILD)/trace_tool: examples/trace_tool.c | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) $< -o $@ -lm

$(BUILD)/loss_plot: examples/loss_plot.c | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) $< -o $@ -lm

$(BUILD)/link_sample: examples/link_sample.c | $(BUILD)
	$(CC) -std=c99 -O2 $(WARN) $(CFLAGS) $< -o $@

# Hundreds of ranks on the multi-host bed (root): forming a job at 16..256 ranks, the GPT at 256
# across 32 hosts against one host, a rank killed. About 10 minutes on 2 cores.
bench-scale: check-deps
	@BUILD=$(BUILD) bash examples/bench_scale.sh

# The picture README shows: two steps of the GPT on 2 ranks, traced (FSDP_TRACE), drawn by trace_tool.
trace-picture: $(BUILD)/gpt $(BUILD)/trace_tool
	rm -rf $(BUILD)/trace_gpt
	FSDP_TRACE=$(BUILD)/trace_gpt $(BUILD)/gpt --nproc 2 --steps 10 --ckpt none --sample 0 >/dev/null
	$(BUILD)/trace_tool summary $(BUILD)/trace_gpt --top 3
	$(BUILD)/trace_tool svg $(BUILD)/trace_gpt examples/trace_gpt_p2.svg --steps 9-10 --width 1000 \
	    --title "build/gpt --nproc 2 (FULL_SHARD, 4 blocks)"

bench: $(BUILD)/bench_comm $(BUILD)/bench_train
# The GPT with fsdp.h against the same GPT in PyTorch (tests/torch_gpt.py; eager, and DDP over gloo),
# every strategy and param_dtype, and PyTorch again with OpenBLAS's AVX-512 kernels forced where the
# CPU has them; the issue's config, then a wider one. TORCH_PYTHON: the interpreter that has torch.
# About 20 minutes on 2 cores.
TORCH_PYTHON ?= /usr/bin/python3
bench-torch: $(BUILD)/bench_train
	OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_train --model gpt --torch --torch-python $(TORCH_PYTHON) \
	    --torch-coretype auto --rounds 3
	OPENBLAS_NUM_THREADS=1 $(BUILD)/bench_train --model gpt --torch --torch-python $(TORCH_PYTHON) \
	    --torch-coretype auto --rounds 2 --layers 8 --channels 512 --heads 8 --seq-len 256 --steps 4 --warmup 2
bench-mpi: $(BUILD)/bench_comm_mpi
# Across 2 simulated hosts (network namespaces, links shaped to 10 Gbit/s; root): fsdp.h hierarchical vs
# flat sockets vs Open MPI's collectives at 2x2 and 2x4 ranks, 64 MiB, and the GPT with HYBRID_SHARD
# across hosts vs FULL_SHARD on one (examples/bench_multihost.sh; --help there for the options).
BENCH_MULTIHOST_ARGS ?= --gpt
bench-multihost: $(BUILD)/bench_comm $(BUILD)/bench_comm_mpi $(BUILD)/gpt
	BUILD=$(BUILD) bash examples/bench_multihost.sh $(BENCH_MULTIHOST_ARGS)
tools: $(BUILD)/ckpt_tool $(BUILD)/trace_tool $(BUILD)/loss_plot

demo: check-deps $(BUILD)/gpt
	$(BUILD)/gpt --nproc 4

# A GPT of 85 M parameters (GPT-2 small's blocks: 12 x 768 channels, 12 heads; byte vocabulary) on 4
# local ranks, FULL_SHARD with every block recomputed in backward, each rank under a 768 MiB budget that
# gpt checks against its estimate before allocating anything: 1 rank is refused (it needs 1.4 GiB),
# then 4 ranks train a few steps and print their peak RSS against the estimate. About a minute on 2 cores.
DEMO_BIG ?= --layers 12 --channels 768 --heads 12 --seq-len 64 --batch 4 --steps 10 --warmup 3 --lr 3e-4 \
	--print-every 1 --sample 0 --ckpt none --recompute --mem-budget 768
demo-big: check-deps $(BUILD)/gpt
	@echo '$$ $(BUILD)/gpt --nproc 1 $(DEMO_BIG)'
	@! $(BUILD)/gpt --nproc 1 $(DEMO_BIG)
	@echo; echo '$$ $(BUILD)/gpt --nproc 4 $(DEMO_BIG)'
	@$(BUILD)/gpt --nproc 4 $(DEMO_BIG)

# A GPT whose training state (16 bytes a parameter: f32 weights and gradients, AdamW's two moments) is
# more than 1.5x this machine's RAM: 2.4 B parameters (48 blocks of 2048 channels, 16 heads) on 4 local
# ranks, every block recomputed, the parameters, gradients and optimizer state on local disk under
# OFFLOAD_DIR (default build/offload; 39 GB free needed, not tmpfs). gpt first refuses it without
# offload (its estimate exceeds the 5000 MiB per-rank budget), then trains 3 steps with it and prints
# every rank's peak RSS, the disk bytes and the roofline ratio; the directory is empty afterwards.
# About 15 minutes on 2 cores; not part of make test.
OFFLOAD_DIR ?= $(BUILD)/offload
DEMO_HUGE ?= --layers 48 --channels 2048 --heads 16 --seq-len 64 --batch 16 --steps 3 --warmup 0 --lr 2e-7 \
	--min-lr 2e-7 --print-every 1 --sample 0 --ckpt none --recompute --mem-budget 5000
demo-huge: check-deps $(BUILD)/gpt
	@mkdir -p $(OFFLOAD_DIR)
	@echo '$$ $(BUILD)/gpt --nproc 4 $(DEMO_HUGE)'
	@! $(BUILD)/gpt --nproc 4 $(DEMO_HUGE)
	@echo; echo '$$ $(BUILD)/gpt --nproc 4 $(DEMO_HUGE) --offload all --offload-dir $(OFFLOAD_DIR)'
	@$(BUILD)/gpt --nproc 4 $(DEMO_HUGE) --offload all --offload-dir $(OFFLOAD_DIR)
	@echo "$(OFFLOAD_DIR) after the run: $$(ls -A $(OFFLOAD_DIR) | wc -l) entries"; test -z "$$(ls -A $(OFFLOAD_DIR))"

# Lose a host, keep training (issue 38; root): the GPT with --recover, HYBRID_SHARD, on 4 simulated hosts
# x 2 ranks with 2 Gbit/s links; h2's ranks are killed (SIGKILL) once step 8 is printed and the others
# train on to step 20. Prints the recovery's timeline (ms after the kill) and the losses. Options (a
# silent host, another host, demo-big's model, today's restart from a checkpoint for comparison):
# bash examples/recover_bed.sh --help.
DEMO_RECOVER ?=
demo-recover: check-deps $(BUILD)/gpt
	@BUILD=$(BUILD) bash examples/recover_bed.sh $(DEMO_RECOVER)

demo-mlp: check-deps $(BUILD)/mlp
	$(BUILD)/mlp --nproc 4 --strategy full --hidden 1024 --layers 6 --batch 512 --steps 100 --print-every 10

demo-collectives: check-deps $(BUILD)/demo_collectives
	$(BUILD)/demo_collectives --nproc 4

# libFuzzer on the safetensors parser (clang; -fsanitize=fuzzer needs libclang-rt-14-dev). A crash
# stops the run: copy $(BUILD)/fuzz-artifacts/crash-* to tests/corpus/safetensors/crashers/,
# where test_checkpoint replays every file.
FUZZ_CC   ?= clang
FUZZ_TIME ?= 120
$(BUILD)/fuzz_safetensors: tests/fuzz_safetensors.c fsdp.h | $(BUILD)
	@command -v $(FUZZ_CC) >/dev/null || { echo "error: $(FUZZ_CC) not found; sudo apt-get install clang libclang-rt-14-dev"; exit 1; }
	$(FUZZ_CC) -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. $< -o $@ $(LDLIBS)

fuzz: $(BUILD)/fuzz_safetensors
	@mkdir -p $(BUILD)/fuzz-corpus $(BUILD)/fuzz-artifacts
	$(BUILD)/fuzz_safetensors -max_total_time=$(FUZZ_TIME) -max_len=16384 -dict=tests/fuzz_safetensors.dict \
	    -artifact_prefix=$(BUILD)/fuzz-artifacts/ -print_final_stats=1 $(BUILD)/fuzz-corpus tests/corpus/safetensors
	@$(MAKE) --no-print-directory fuzz-index
	@$(MAKE) --no-print-directory fuzz-hello

# The same for index.json (crashers go to tests/corpus/index/crashers/, replayed by test_files)
# and for the socket handshake and header parsing (tests/corpus/hello/crashers/).
.PHONY: fuzz-index fuzz-hello
$(BUILD)/fuzz_index: tests/fuzz_index.c fsdp.h | $(BUILD)
	@command -v $(FUZZ_CC) >/dev/null || { echo "error: $(FUZZ_CC) not found; sudo apt-get install clang libclang-rt-14-dev"; exit 1; }
	$(FUZZ_CC) -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. $< -o $@ $(LDLIBS)

$(BUILD)/fuzz_hello: tests/fuzz_hello.c fsdp.h | $(BUILD)
	@command -v $(FUZZ_CC) >/dev/null || { echo "error: $(FUZZ_CC) not found; sudo apt-get install clang libclang-rt-14-dev"; exit 1; }
	$(FUZZ_CC) -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. $< -o $@ $(LDLIBS)

fuzz-index: $(BUILD)/fuzz_index
	@mkdir -p $(BUILD)/fuzz-corpus-index $(BUILD)/fuzz-artifacts
	$(BUILD)/fuzz_index -max_total_time=$(FUZZ_TIME) -max_len=16384 -dict=tests/fuzz_index.dict \
	    -artifact_prefix=$(BUILD)/fuzz-artifacts/index- -print_final_stats=1 $(BUILD)/fuzz-corpus-index tests/corpus/index

fuzz-hello: $(BUILD)/fuzz_hello
	@mkdir -p $(BUILD)/fuzz-corpus-hello $(BUILD)/fuzz-artifacts
	$(BUILD)/fuzz_hello -max_total_time=$(FUZZ_TIME) -max_len=1024 -dict=tests/fuzz_hello.dict \
	    -artifact_prefix=$(BUILD)/fuzz-artifacts/hello- -print_final_stats=1 $(BUILD)/fuzz-corpus-hello tests/corpus/hello

clean:
	rm -rf $(BUILD)

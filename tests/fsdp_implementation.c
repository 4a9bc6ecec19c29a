/* fsdp.h's implementation alone: the Makefile compiles it once per build directory (that is, per
   set of flags) and links it into the test programs that guard their own FSDP_IMPLEMENTATION with
   FSDP_TEST_IMPLEMENTATION_LINKED, those that need nothing of their own from it (no configuration
   macros, no private functions). The implementation is most of a test program's compile time. */
#define _GNU_SOURCE
#define FSDP_IMPLEMENTATION
#include "fsdp.h"

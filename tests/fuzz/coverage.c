/* Edge coverage for the fuzzers: with -fsanitize-coverage=trace-pc, GCC calls
 * __sanitizer_cov_trace_pc at every basic block of the instrumented sources. Each call counts the
 * edge (previous block, this block) in allocsim_cov_map, as AFL does; the fuzzers read the map
 * through ctypes and keep the inputs that reach new edges. Compiled without the instrumentation
 * (build_sanitized.py --coverage links it into the readers only when fuzzing). */
#include <stddef.h>
#include <stdint.h>

#define MAP_BITS 16

uint8_t allocsim_cov_map[1 << MAP_BITS];
size_t allocsim_cov_map_size = 1 << MAP_BITS;
static uintptr_t previous;

void __sanitizer_cov_trace_pc(void) {
    uintptr_t block = ((uintptr_t)__builtin_return_address(0) * 0x9E3779B97F4A7C15ULL) >> (64 - MAP_BITS);
    allocsim_cov_map[(block ^ previous) & ((1 << MAP_BITS) - 1)]++;
    previous = block >> 1;
}

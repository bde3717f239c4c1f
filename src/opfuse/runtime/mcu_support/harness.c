/* opfuse test firmware: run the model once on baked-in inputs and print what it did.
 *
 * Instruction count: QEMU runs with -icount shift=S, so the virtual clock advances exactly
 * 2^S ns per executed instruction. Two CMSDK timers clocked at 25 MHz read that clock: APB
 * timer 0 (one tick per 40 ns; exact modulo 2^32 ticks) and dual timer 1 with prescale 256
 * (coarse; only used to count timer 0's wraps). The host converts ticks to instructions.
 *
 * Stack: the region below main's frame (nothing lives below SP: the AAPCS has no red zone, and
 * no interrupt is enabled) is painted before the call and scanned after it; the
 * depth printed is from main's stack pointer to the deepest word written (-1: deeper than
 * the painted region).
 *
 * Output (semihosting stdout), parsed by opfuse.runtime.mcu:
 *   opfuse-mcu: rc=R fine=F coarse=C overhead=O stack=B
 *   opfuse-mcu: output J WORDS       followed by WORDS 32-bit hex words of the output's bytes
 *   opfuse-mcu: mark G T             per-kernel marks (profile builds: HARNESS_MARKS > 0): the group
 *                                    index (-2: two back-to-back marks measuring a mark's own cost,
 *                                    -1: before the first kernel) and timer 0's value
 *   opfuse-mcu: end */
#include <stdint.h>
#include <stdio.h>

#include "model.h"
#include "harness_data.h"

#define APB_TIMER0 ((volatile uint32_t*)0x40000000u)  /* CTRL, VALUE, RELOAD, INTSTATUS */
#define DUAL_TIMER1 ((volatile uint32_t*)0x40002000u) /* LOAD, VALUE, CONTROL, INTCLR */
#define DUAL_ENABLE 0x80u
#define DUAL_PRESCALE_256 0x08u
#define DUAL_32BIT 0x02u
#define STACK_PAINT_BYTES (64u * 1024u)
#define STACK_PATTERN 0xA5C3E1F0u

static uint8_t arena[OPFUSE_ARENA_BYTES + 1u] __attribute__((aligned(64)));

typedef struct { uint32_t fine, coarse; } stamp_t;

static inline stamp_t now(void) {
  stamp_t s;
  __asm__ volatile("" ::: "memory");
  s.fine = APB_TIMER0[1];
  s.coarse = DUAL_TIMER1[1];
  __asm__ volatile("" ::: "memory");
  return s;
}

static void start_timers(void) {
  APB_TIMER0[0] = 0u;
  APB_TIMER0[2] = 0xFFFFFFFFu;
  APB_TIMER0[1] = 0xFFFFFFFFu;
  APB_TIMER0[0] = 1u;
  DUAL_TIMER1[2] = 0u;
  DUAL_TIMER1[0] = 0xFFFFFFFFu;
  DUAL_TIMER1[2] = DUAL_ENABLE | DUAL_PRESCALE_256 | DUAL_32BIT;  /* free-running */
}

#if HARNESS_MARKS > 0
/* Called by a profile build's opfuse_run after every kernel (and once before the first). */
#define HARNESS_MARK_SLOTS (HARNESS_MARKS + 3)
static uint32_t mark_fine[HARNESS_MARK_SLOTS];
static int mark_group[HARNESS_MARK_SLOTS];
static unsigned marks;

__attribute__((noinline)) void opfuse_kernel_mark(int group) {
  const uint32_t t = APB_TIMER0[1];
  if (marks < HARNESS_MARK_SLOTS) {
    mark_fine[marks] = t;
    mark_group[marks] = group;
  }
  ++marks;
}
#endif

static uint32_t* stack_pointer(void) {
  uint32_t* sp;
  __asm__ volatile("mov %0, sp" : "=r"(sp));
  return sp;
}

int main(void) {
  uint32_t* const top = stack_pointer();
  volatile uint32_t* const low = (volatile uint32_t*)((uint8_t*)top - STACK_PAINT_BYTES);
  volatile uint32_t* p;
  stamp_t s0, s1, a, b;
  long stack = 0;
  int rc, j;
  uint32_t i;

  for (p = low; p < low + STACK_PAINT_BYTES / 4u; ++p) *p = STACK_PATTERN;
  start_timers();
  s0 = now();
  s1 = now();
#if HARNESS_MARKS > 0
  opfuse_kernel_mark(-2);
  opfuse_kernel_mark(-2);
#endif
  a = now();
  rc = opfuse_run(harness_inputs, harness_outputs, arena);
  b = now();
  for (p = low; p < low + STACK_PAINT_BYTES / 4u; ++p) {
    if (*p != STACK_PATTERN) break;
  }
  stack = p == low ? -1L : (long)((const uint8_t*)top - (const uint8_t*)p);
  printf("opfuse-mcu: rc=%d fine=%lu coarse=%lu overhead=%lu stack=%ld\n", rc, (unsigned long)(a.fine - b.fine),
         (unsigned long)(a.coarse - b.coarse), (unsigned long)(s0.fine - s1.fine), stack);
  for (j = 0; j < HARNESS_NUM_OUTPUTS; ++j) {
    printf("opfuse-mcu: output %d %lu\n", j, (unsigned long)harness_output_words[j]);
    for (i = 0; i < harness_output_words[j]; ++i) {
      printf("%08lx%c", (unsigned long)harness_output_data[j][i], (i % 8u == 7u) ? '\n' : ' ');
    }
    if (harness_output_words[j] % 8u) printf("\n");
  }
#if HARNESS_MARKS > 0
  for (i = 0; i < marks && i < HARNESS_MARK_SLOTS; ++i) {
    printf("opfuse-mcu: mark %d %lu\n", mark_group[i], (unsigned long)mark_fine[i]);
  }
#endif
  printf("opfuse-mcu: end\n");
  return rc;
}

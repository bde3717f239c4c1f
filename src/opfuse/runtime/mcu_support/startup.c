/* Reset and fault handlers of the opfuse test firmware (QEMU mps2-an500, Cortex-M7).
 *
 * Reset enables the FPU (the code is built for the hard-float ABI: the first floating-point
 * instruction faults while CP10/CP11 are off) and hands over to newlib's rdimon start-up
 * (_start: zeroes .bss, sets up semihosting stdio, calls main, exits with its value). A
 * fault prints one line through semihosting and exits with status 70. */
#include <stdint.h>

#define CPACR (*(volatile uint32_t*)0xE000ED88u)
#define SEMIHOSTING_SYS_WRITE0 0x04u
#define SEMIHOSTING_SYS_EXIT_EXTENDED 0x20u
#define ADP_STOPPED_APPLICATION_EXIT 0x20026u
#define FAULT_EXIT_STATUS 70u

extern void _start(void);
extern uint32_t __stack_top;

static uint32_t semihosting(uint32_t op, const void* arg) {
  register uint32_t r0 __asm__("r0") = op;
  register const void* r1 __asm__("r1") = arg;
  __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}

void opfuse_reset_handler(void) {
  CPACR |= 0xFu << 20;  /* CP10 and CP11: full access */
  __asm__ volatile("dsb\n\tisb" ::: "memory");
  _start();
  for (;;) {}
}

void opfuse_fault_handler(void) {
  static const uint32_t exit_block[2] = {ADP_STOPPED_APPLICATION_EXIT, FAULT_EXIT_STATUS};
  semihosting(SEMIHOSTING_SYS_WRITE0, "opfuse-mcu: fault (hard fault, memory, bus or usage fault)\n");
  semihosting(SEMIHOSTING_SYS_EXIT_EXTENDED, exit_block);
  for (;;) {}
}

typedef void (*vector_t)(void);

/* Initial SP, reset, NMI, HardFault, MemManage, BusFault, UsageFault, 4 reserved, SVCall,
 * DebugMonitor, reserved, PendSV, SysTick. No interrupt is enabled. */
__attribute__((section(".vectors"), used)) static const vector_t vectors[16] = {
    (vector_t)(uintptr_t)&__stack_top, opfuse_reset_handler, opfuse_fault_handler, opfuse_fault_handler,
    opfuse_fault_handler, opfuse_fault_handler, opfuse_fault_handler, 0, 0, 0, 0,
    opfuse_fault_handler, opfuse_fault_handler, 0, opfuse_fault_handler, opfuse_fault_handler,
};

/* opfuse's aarch64 harness: runs a generated host program (model.c, single-threaded) once, on raw files.

     model WEIGHTS IN_0 ... IN_{n-1} OUT_0 ... OUT_{m-1}

   WEIGHTS: the weights blob (at least opfuse_weights_bytes() bytes); IN_i: input i's bytes, C order, exactly its size;
   OUT_j: where output j's bytes are written. Sizes come from harness_io.h (written with the model).
   Exit 0: done; 2: bad arguments or files (one line on stderr); 3: opfuse_run returned a fault code (printed
   as "opfuse-aarch64: fault N"); 4: out of memory or a write failed. */
#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model.h"
#include "harness_io.h"

static void* alloc64(size_t n) {
  void* p = NULL;
  if (posix_memalign(&p, 64, n ? n : 1) != 0) return NULL;
  memset(p, 0, n ? n : 1);
  return p;
}

/* The first `want` bytes of the file into a fresh 64-byte aligned buffer; NULL (with a line) where it holds fewer,
   or more and `exact` (the weights blob may be padded past opfuse_weights_bytes()). */
static void* read_file(const char* path, size_t want, int exact, const char* what) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "opfuse-aarch64: cannot open %s '%s'\n", what, path);
    return NULL;
  }
  void* buf = alloc64(want);
  size_t got = buf ? fread(buf, 1, want, f) : 0;
  int extra = exact && fgetc(f) != EOF;
  fclose(f);
  if (!buf || got != want || extra) {
    fprintf(stderr, "opfuse-aarch64: %s '%s' must hold %s %zu bytes\n", what, path, exact ? "exactly" : "at least",
            want);
    free(buf);
    return NULL;
  }
  return buf;
}

int main(int argc, char** argv) {
  if (argc != 2 + HARNESS_NUM_INPUTS + HARNESS_NUM_OUTPUTS) {
    fprintf(stderr, "usage: %s WEIGHTS %d input file(s) %d output file(s)\n", argv[0], HARNESS_NUM_INPUTS,
            HARNESS_NUM_OUTPUTS);
    return 2;
  }
  void* weights = read_file(argv[1], opfuse_weights_bytes(), 0, "weights");
  if (!weights) return 2;
  void* inputs[HARNESS_NUM_INPUTS + 1];
  void* outputs[HARNESS_NUM_OUTPUTS + 1];
  for (int i = 0; i < HARNESS_NUM_INPUTS; ++i) {
    inputs[i] = read_file(argv[2 + i], harness_input_bytes[i], 1, "input");
    if (!inputs[i]) return 2;
  }
  for (int j = 0; j < HARNESS_NUM_OUTPUTS; ++j) {
    outputs[j] = alloc64(harness_output_bytes[j]);
    if (!outputs[j]) return 4;
  }
  char* arena = alloc64(opfuse_arena_bytes());
  char* scratch = alloc64(opfuse_scratch_stride());
  if (!arena || !scratch) return 4;
  const int rc = opfuse_run(inputs, outputs, arena, (const char*)weights, scratch, 1);
  if (rc != 0) {
    printf("opfuse-aarch64: fault %d\n", rc);
    return 3;
  }
  for (int j = 0; j < HARNESS_NUM_OUTPUTS; ++j) {
    const char* path = argv[2 + HARNESS_NUM_INPUTS + j];
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(outputs[j], 1, harness_output_bytes[j], f) != harness_output_bytes[j] || fclose(f) != 0) {
      fprintf(stderr, "opfuse-aarch64: cannot write output '%s'\n", path);
      return 4;
    }
  }
  return 0;
}

/* Host cost per launch of Triton's AOT C stubs, for the benchmark pack's kernels.
 *
 * bench/triton_launch_bench.py generates the stubs with `python -m triton.tools.compile`
 * and `python -m triton.tools.link` (one linked entry point per kernel, named after it:
 * args4_default, args14_default, args32_default) and compiles this file with them:
 *
 *   cc -O2 -include stdlib.h -I<stub dir> -I/usr/local/cuda/include aot_bench.c \
 *      <every .c in the stub dir> -L/usr/local/cuda/lib64/stubs -lcuda -lm
 *
 * Timing follows bench/launch_bench.cc: one sample is a batch of BATCH launches between two
 * clock_gettime(CLOCK_MONOTONIC) calls, the stream synchronized before the batch and outside
 * the timed region, so the GPU queue never fills and only host time is measured. A
 * repetition is ITERS batches; the kernels run in a different order in each repetition to
 * spread drift. Before timing, each kernel runs once on known data and its output is
 * compared with the expected sum, so no row times a failing or empty launch.
 *
 * Usage: aot_bench N BATCH ITERS REPS WARMUP_BATCHES
 * Prints one JSON object on stdout: driver version, the check's maximum errors, and per
 * kernel the host microseconds per launch of every repetition.
 */
#include <cuda.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "args14_link.h"
#include "args32_link.h"
#include "args4_link.h"

#define MAX_INPUTS 15
#define NUM_KERNELS 3

static const char* const kNames[NUM_KERNELS] = {"args4", "args14", "args32"};
static const int kInputs[NUM_KERNELS] = {1, 6, 15};

static CUstream stream;
static CUdeviceptr in[MAX_INPUTS], out;
static int32_t n, s[MAX_INPUTS];

static void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* name = "?";
    const char* text = "?";
    cuGetErrorName(r, &name);
    cuGetErrorString(r, &text);
    fprintf(stderr, "aot_bench: %s failed: %s (%d): %s\n", what, name, (int)r, text);
    exit(1);
  }
}

/* One launch of kernel k through its linked AOT entry point, exactly as a user calls it. */
static inline CUresult Launch(int k) {
  switch (k) {
    case 0:
      return args4_default(stream, in[0], out, n, s[0]);
    case 1:
      return args14_default(stream, in[0], in[1], in[2], in[3], in[4], in[5], out, n, s[0], s[1],
                            s[2], s[3], s[4], s[5]);
    default:
      return args32_default(stream, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8],
                            in[9], in[10], in[11], in[12], in[13], in[14], out, n, s[0], s[1],
                            s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12],
                            s[13], s[14]);
  }
}

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Seconds spent enqueuing `batches` batches of `batch` launches of kernel k. */
static double TimeBatches(int k, int batch, int batches) {
  double total = 0;
  for (int b = 0; b < batches; ++b) {
    Check(cuStreamSynchronize(stream), "cuStreamSynchronize");
    double t0 = Now();
    for (int i = 0; i < batch; ++i) {
      CUresult r = Launch(k);
      if (r != CUDA_SUCCESS) Check(r, kNames[k]);
    }
    total += Now() - t0;
  }
  Check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  return total;
}

/* Runs kernel k once on known inputs; returns the largest |out - expected|. Inputs hold
 * j * 0.25 + (i + 1) and the scalars 2 * i + 3 (never 1, never a multiple of 16), so every
 * sum is exact in fp32. `out` is filled with NaN first, so a launch that did nothing fails. */
static double CheckKernel(int k, float* host_in, float* host_out) {
  double expected_scalars = 0;
  for (int i = 0; i < kInputs[k]; ++i) expected_scalars += s[i];
  Check(cuMemsetD32(out, 0x7fc00000u, (size_t)n), "cuMemsetD32");
  Check(Launch(k), kNames[k]);
  Check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  Check(cuMemcpyDtoH(host_out, out, sizeof(float) * (size_t)n), "cuMemcpyDtoH");
  double worst = 0;
  for (int j = 0; j < n; ++j) {
    double expected = expected_scalars;
    for (int i = 0; i < kInputs[k]; ++i) expected += host_in[(size_t)i * n + j];
    double err = fabs((double)host_out[j] - expected);
    if (!(err <= worst)) worst = err; /* NaN propagates */
  }
  return worst;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s N BATCH ITERS REPS WARMUP_BATCHES\n", argv[0]);
    return 2;
  }
  n = atoi(argv[1]);
  int batch = atoi(argv[2]), iters = atoi(argv[3]), reps = atoi(argv[4]);
  int warmup = atoi(argv[5]);
  if (n <= 0 || batch <= 0 || iters <= 0 || reps <= 0 || warmup < 0) {
    fprintf(stderr, "aot_bench: N, BATCH, ITERS, REPS must be positive, WARMUP >= 0\n");
    return 2;
  }

  CUdevice dev;
  CUcontext ctx;
  int driver_version = 0;
  Check(cuInit(0), "cuInit");
  Check(cuDriverGetVersion(&driver_version), "cuDriverGetVersion");
  Check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  Check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  Check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");

  float* host_in = malloc(sizeof(float) * MAX_INPUTS * (size_t)n);
  float* host_out = malloc(sizeof(float) * (size_t)n);
  if (!host_in || !host_out) {
    fprintf(stderr, "aot_bench: out of host memory\n");
    return 1;
  }
  for (int i = 0; i < MAX_INPUTS; ++i) {
    for (int j = 0; j < n; ++j) host_in[(size_t)i * n + j] = (float)j * 0.25f + (float)(i + 1);
    Check(cuMemAlloc(&in[i], sizeof(float) * (size_t)n), "cuMemAlloc");
    Check(cuMemcpyHtoD(in[i], host_in + (size_t)i * n, sizeof(float) * (size_t)n),
          "cuMemcpyHtoD");
    s[i] = 2 * i + 3;
  }
  Check(cuMemAlloc(&out, sizeof(float) * (size_t)n), "cuMemAlloc");

  double errors[NUM_KERNELS];
  for (int k = 0; k < NUM_KERNELS; ++k) errors[k] = CheckKernel(k, host_in, host_out);
  for (int k = 0; k < NUM_KERNELS; ++k) TimeBatches(k, batch, warmup);

  double* us = malloc(sizeof(double) * NUM_KERNELS * (size_t)reps);
  if (!us) return 1;
  unsigned seed = 12345u;
  for (int r = 0; r < reps; ++r) {
    int order[NUM_KERNELS] = {0, 1, 2};
    for (int i = NUM_KERNELS - 1; i > 0; --i) { /* Fisher-Yates with a fixed LCG */
      seed = seed * 1103515245u + 12345u;
      int j = (int)((seed >> 16) % (unsigned)(i + 1));
      int t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    for (int i = 0; i < NUM_KERNELS; ++i) {
      int k = order[i];
      us[k * reps + r] = 1e6 * TimeBatches(k, batch, iters) / ((double)batch * iters);
    }
  }

  printf("{\"driver_version\": %d, \"n\": %d, \"batch\": %d, \"iters\": %d, \"reps\": %d,\n",
         driver_version, n, batch, iters, reps);
  printf(" \"max_error\": {");
  for (int k = 0; k < NUM_KERNELS; ++k) {
    if (errors[k] != errors[k]) {
      printf("%s\"%s\": \"nan\"", k ? ", " : "", kNames[k]);
    } else {
      printf("%s\"%s\": %.9g", k ? ", " : "", kNames[k], errors[k]);
    }
  }
  printf("},\n \"us_per_launch\": {");
  for (int k = 0; k < NUM_KERNELS; ++k) {
    printf("%s\"%s\": [", k ? ", " : "", kNames[k]);
    for (int r = 0; r < reps; ++r) printf("%s%.6f", r ? ", " : "", us[k * reps + r]);
    printf("]");
  }
  printf("}}\n");
  return 0;
}

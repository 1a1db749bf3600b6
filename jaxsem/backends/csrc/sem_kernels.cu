// jaxsem CUDA kernels for the bake-off operators, called from JAX through the XLA FFI.
//
// The classic GPU layout of the spectral-element kernels (Świrydowicz et al. 2019,
// SEEDS.md §2), which Triton cannot express for n or q that are not powers of two:
//   * one element per (N×N or Q×Q) thread layer, EB elements per block;
//   * thread (i, j) keeps the element's k-column in registers, so the t-direction
//     contractions never leave the thread;
//   * the r/s contractions read one k-slice from shared memory (double-buffered, two
//     barriers per slice); D/J in shared memory;
//   * u and the geometric factors are read once, w is written once, coalesced.
// Arrays are the library's: u, w (C, E, n, n, n) [c, e, k, j, i]; G (6, E, m, m, m)
// rr, rs, rt, ss, st, tt; B (E, q, q, q); D (n, n); J (q, n); Dq (q, q).
//   BK5/BK6 (GLL, collocated):  w = Σ_ab D_aᵀ G_ab D_b u,   ur = (I⊗I⊗D) u, ...
//   BK1/BK2 (mass, Gauss):      w = Jᵀ⊗Jᵀ⊗Jᵀ (B ⊙ J⊗J⊗J u)
//   BK3/BK4 (stiffness, Gauss): X = J⊗J⊗J u, then the BK5 form on the Gauss points
//                               with Dq (Dq J = Dt), then Jᵀ⊗Jᵀ⊗Jᵀ back.
// Built by jaxsem/backends/cuda.py (nvcc, the device's own architecture) on first use, one
// library per operator, dtype and order: -DJAXSEM_OP_BK5|BK5A|MAXWELL|ADVECTION|MASS|STIFFNESS|GS,
// -DJAXSEM_REAL=double|float and -DJAXSEM_N=n (not for GS) select what is instantiated.

#include <cstdint>
#include <string>
#include <type_traits>
#include <cuda_runtime.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int threads_target = 256;

template <int M>
__host__ __device__ constexpr int elements_per_block() {
  return (threads_target / (M * M)) > 0 ? threads_target / (M * M) : 1;
}

// ------------------------------------------------------------------------- BK5 / BK6
template <int N, typename T>
__global__ void __launch_bounds__(N * N * elements_per_block<N>())
bk5_kernel(int64_t E, int C, const T* __restrict__ u, const T* __restrict__ D,
           const T* __restrict__ G, T* __restrict__ w) {
  constexpr int EB = elements_per_block<N>();
  constexpr int P = N + 1;  // padded row: no bank conflicts between j rows
  __shared__ T sD[N][P];    // sD[a][b] = D[a][b]
  __shared__ T sDt[N][P];   // sDt[b][a] = D[a][b]
  __shared__ T su[2][EB][N][P];
  __shared__ T sr[EB][N][P];
  __shared__ T ss[EB][N][P];
  const int i = threadIdx.x, j = threadIdx.y, z = threadIdx.z;
  const int tid = i + N * (j + N * z);
  for (int t = tid; t < N * N; t += N * N * EB) {
    sD[t / N][t % N] = D[t];
    sDt[t % N][t / N] = D[t];
  }
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  constexpr int64_t n2 = N * N, n3 = N * N * N;
  const int64_t stride = E * n3;
  const int64_t base = (active ? e : 0) * n3 + j * N + i;
  __syncthreads();
  for (int c = 0; c < C; ++c) {
    const T* uc = u + c * stride + base;
    T ru[N], rt[N], rw[N];
#pragma unroll
    for (int k = 0; k < N; ++k) ru[k] = active ? uc[k * n2] : T(0);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      T s = 0;
#pragma unroll
      for (int m = 0; m < N; ++m) s += sD[k][m] * ru[m];
      rt[k] = s;
      rw[k] = 0;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int b = k & 1;
      su[b][z][j][i] = ru[k];
      __syncthreads();
      T ur = 0, us = 0;
#pragma unroll
      for (int m = 0; m < N; ++m) {
        ur += sDt[m][i] * su[b][z][j][m];
        us += sD[j][m] * su[b][z][m][i];
      }
      const T* g = G + base + k * n2;
      T g0 = 0, g1 = 0, g2 = 0, g3 = 0, g4 = 0, g5 = 0;
      if (active) {
        g0 = g[0];
        g1 = g[stride];
        g2 = g[2 * stride];
        g3 = g[3 * stride];
        g4 = g[4 * stride];
        g5 = g[5 * stride];
      }
      const T ut = rt[k];
      sr[z][j][i] = g0 * ur + g1 * us + g2 * ut;
      ss[z][j][i] = g1 * ur + g3 * us + g4 * ut;
      const T gt = g2 * ur + g4 * us + g5 * ut;
#pragma unroll
      for (int m = 0; m < N; ++m) rw[m] += sD[k][m] * gt;
      __syncthreads();
      T acc = 0;
#pragma unroll
      for (int m = 0; m < N; ++m) acc += sD[m][i] * sr[z][j][m] + sD[m][j] * ss[z][m][i];
      rw[k] += acc;
    }
    if (active) {
      T* wc = w + c * stride + base;
#pragma unroll
      for (int k = 0; k < N; ++k) wc[k * n2] = rw[k];
    }
  }
}

// ================================================================ whole-element variants
// Variant 2 ("element"): the whole element goes through shared memory once per stage,
// so a kernel needs 2 (BK5) to 8 (BK3) block barriers per element instead of two per
// slice, and each thread has N independent sums per stage (more work between barriers).
// Shared memory is dynamic (opted in above 48 KB): per element 3N³ words (BK5), 3Q³
// (stiffness). MINB is __launch_bounds__' minimum of resident blocks: 0 leaves ptxas its own
// register heuristic; 2 caps registers at 128 for 256 threads. Not 1: ptxas then takes up to
// 255 registers, and occupancy falls with it. BK5 variants 4-7 add the options of
// collocated_stage (constant-memory operator matrices, register rows of D, G prefetch); see
// launch_bk5 below.

extern __shared__ __align__(16) unsigned char jaxsem_smem[];

#ifndef JAXSEM_REAL
#define JAXSEM_REAL double
#endif

// Variants 4 and up read the operator matrices where every thread of a warp wants the same entry
// (the contractions along k, done in registers) from constant memory: with the loops unrolled the
// index is a compile-time constant and the entry is an operand of the FMA, where variants 2/3
// spend one shared-memory wavefront on each (the L1/shared pipe, not the FP64 pipe, is what
// limits the Gauss kernels). One slot per order n, so launches of different orders never share
// one: the host copies the matrices in (device to device, on the kernel's stream, so in stream
// order) before each launch.
// BK5: D (n²); mass: J (qn); stiffness: J (qn) then Dq (q²); q = n + 1.
__host__ __device__ constexpr int ops_words(int n) {
#if defined(JAXSEM_OP_BK5) || defined(JAXSEM_OP_BK5A) || defined(JAXSEM_OP_MAXWELL) || defined(JAXSEM_OP_MAXWELLM) || \
    defined(JAXSEM_OP_ADVECTION)
  return n * n;
#elif defined(JAXSEM_OP_MASS)
  return (n + 1) * n;
#elif defined(JAXSEM_OP_CONV) || defined(JAXSEM_OP_CONVT)
  return 2 * ((3 * n + 1) / 2) * n;  // J then Dd, each q × n on the 3/2 rule q = ceil(3n/2)
#else
  return (n + 1) * n + (n + 1) * (n + 1);
#endif
}

__host__ __device__ constexpr int ops_offset(int n) { return n <= 2 ? 0 : ops_offset(n - 1) + ops_words(n - 1); }

__constant__ JAXSEM_REAL c_ops[ops_offset(17)];

constexpr int OPT_CONST = 1, OPT_ROWS = 2, OPT_PREFETCH = 4;

// Bit of the FFI attribute "variant" that turns prefetch_block on (cuda.PREFETCH_L2).
constexpr int PREFETCH_L2 = 64;
// Bit of the attribute "variant" for BK5/BK6 on an affine mesh (cuda.AFFINE): the factors are
// (6, E) constants and D carries the GLL weights (bk5_element_kernel's AFF).
constexpr int AFFINE = 128;

// L2 prefetch at block start (sm_90 bulk prefetch, a hint: no registers, no shared memory). At
// low occupancy the kernels below stall on their global loads, most of them the geometric factors
// read slice by slice inside a stage and the next component's u. Thread f < F asks L2 for factor
// f of the block's EB elements (each a contiguous range), thread F + c for component c of u; the
// loads then hit L2.
__device__ __forceinline__ void l2_prefetch(const void* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  // 16-byte aligned ends inside [a - 15, a + bytes): XLA's buffers start 64-byte aligned
  const uintptr_t lo = a & ~uintptr_t(15), hi = (a + uintptr_t(bytes)) & ~uintptr_t(15);
  if (hi > lo) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"(unsigned(hi - lo)) : "memory");
#endif
}

// u: (C, E, n³) with n3 words per element; g: F factors (E, m³) gstride apart (B: F = 1).
template <int EB, typename T>
__device__ __forceinline__ void prefetch_block(bool l2, int tid, int64_t E, int C, const T* u, int64_t n3,
                                               const T* g, int F, int64_t gstride, int64_t m3) {
  if (!l2) return;
  const int64_t e0 = int64_t(blockIdx.x) * EB, ne = E - e0 < EB ? E - e0 : EB;
  if (tid < F)
    l2_prefetch(g + tid * gstride + e0 * m3, ne * m3 * int64_t(sizeof(T)));
  else if (tid < F + C)
    l2_prefetch(u + (tid - F) * E * n3 + e0 * n3, ne * n3 * int64_t(sizeof(T)));
}

// operator[] over constant memory at a compile-time offset (OFF: this order's slot)
template <int OFF>
struct ConstOps {
  __device__ __forceinline__ JAXSEM_REAL operator[](int i) const { return c_ops[OFF + i]; }
};

template <typename T>
cudaError_t copy_ops(const T* src, int words, int offset_words, cudaStream_t st) {
  return cudaMemcpyToSymbolAsync(c_ops, src, sizeof(T) * words, sizeof(T) * offset_words,
                                 cudaMemcpyDeviceToDevice, st);
}

// The six geometric factors of thread (a, b)'s column, g(k, f) = G[f][e][k][b][a]: read from
// memory (GStored: p at G[0][e][0][b][a], the factors stride apart; 0 on an inactive element), or
// recomputed on an affine element (GAffine: G_f = c_f w_a w_b w_k, c the element's six constants
// and w the GLL weights, so nothing per node is read).
template <int M, typename T>
struct GStored {
  const T* __restrict__ p;
  int64_t stride;
  bool active;
  __device__ __forceinline__ T operator()(int k, int f) const { return active ? p[k * M * M + f * stride] : T(0); }
};

template <typename T>
struct GAffine {
  T c[6];
  T wab;
  const T* __restrict__ w;
  __device__ __forceinline__ T operator()(int k, int f) const { return c[f] * (wab * w[k]); }
};

// The collocated stiffness stage on an M³ grid (BK5 on the GLL points, BK3 on the Gauss
// points): X holds the element in shared memory, xc[] is thread (a, b)'s column of it, g gives
// its geometric factors (GStored or GAffine); on return rw[k] = (Σ_ab D_aᵀ G_ab D_b x)
// at (k, b, a). GR, GS: M³ words of scratch each. One barrier inside.
// OPT, a bit set (variants 4-7): OPT_CONST reads D where all threads want the same entry from cD
// (ConstOps: constant memory); OPT_ROWS holds thread (a, b)'s rows D[a][:], D[b][:] (then the
// columns D[:][a], D[:][b]) in registers for the whole element instead of re-reading them from
// shared memory for every k (M ≤ 10, where the registers fit); OPT_PREFETCH loads the six
// factors of slice k + 1 while slice k computes.
template <int M, typename T, int OPT, typename UOps, typename GA>
__device__ __forceinline__ void collocated_stage(const T* X, const T (&xc)[M], const T* sD, const T* sDt,
                                                 UOps cD, const GA& g, int a, int b, T* GR, T* GS, T (&rw)[M]) {
  constexpr int m2 = M * M;
  constexpr bool CONST = OPT & OPT_CONST, ROWS = (OPT & OPT_ROWS) && M <= 10, PREF = OPT & OPT_PREFETCH;
  T Da[ROWS ? M : 1], Db[ROWS ? M : 1];
  if constexpr (ROWS) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      Da[m] = sDt[m * M + a];  // D[a][m]
      Db[m] = sD[b * M + m];   // D[b][m]
    }
  }
  T gn[6];
  if constexpr (PREF) {
#pragma unroll
    for (int f = 0; f < 6; ++f) gn[f] = g(0, f);
  }
#pragma unroll
  for (int k = 0; k < M; ++k) rw[k] = 0;
#pragma unroll
  for (int k = 0; k < M; ++k) {
    T g0 = 0, g1 = 0, g2 = 0, g3 = 0, g4 = 0, g5 = 0;
    if constexpr (PREF) {
      g0 = gn[0], g1 = gn[1], g2 = gn[2], g3 = gn[3], g4 = gn[4], g5 = gn[5];
      if (k + 1 < M) {
#pragma unroll
        for (int f = 0; f < 6; ++f) gn[f] = g(k + 1, f);
      }
    }
    T ur = 0, us = 0, ut = 0;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if constexpr (ROWS) {
        ur += Da[m] * X[(k * M + b) * M + m];
        us += Db[m] * X[(k * M + m) * M + a];
      } else {
        ur += sDt[m * M + a] * X[(k * M + b) * M + m];
        us += sD[b * M + m] * X[(k * M + m) * M + a];
      }
      if constexpr (CONST)
        ut += cD[k * M + m] * xc[m];
      else
        ut += sD[k * M + m] * xc[m];
    }
    if constexpr (!PREF) {
      g0 = g(k, 0);
      g1 = g(k, 1);
      g2 = g(k, 2);
      g3 = g(k, 3);
      g4 = g(k, 4);
      g5 = g(k, 5);
    }
    GR[(k * M + b) * M + a] = g0 * ur + g1 * us + g2 * ut;
    GS[(k * M + b) * M + a] = g1 * ur + g3 * us + g4 * ut;
    const T gt = g2 * ur + g4 * us + g5 * ut;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if constexpr (CONST)
        rw[m] += cD[k * M + m] * gt;
      else
        rw[m] += sD[k * M + m] * gt;
    }
  }
  __syncthreads();
  if constexpr (ROWS) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      Da[m] = sD[m * M + a];  // D[m][a]
      Db[m] = sD[m * M + b];  // D[m][b]
    }
  }
#pragma unroll
  for (int k = 0; k < M; ++k) {
    T acc = 0;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if constexpr (ROWS)
        acc += Da[m] * GR[(k * M + b) * M + m] + Db[m] * GS[(k * M + m) * M + a];
      else
        acc += sD[m * M + a] * GR[(k * M + b) * M + m] + sD[m * M + b] * GS[(k * M + m) * M + a];
    }
    rw[k] += acc;
  }
}

// ASM (assembled storage, op "bk5a"): u and w are (C, nf) vectors of global nodes, idx (E, n³)
// the global node of each local one (outside [0, nf): a Dirichlet node, read as 0, not written). The
// element gathers its input through idx and adds its output into w with atomics (w zeroed
// before the launch), so the gather-scatter needs no pass of its own.
// AFF (an affine mesh, bit AFFINE of the variant): G is (6, E), the element's constant factors
// c_f, and D holds n² + n words, D then the GLL weights w; the kernel recomputes G_f = c_f w⊗w⊗w
// instead of reading 6 n³ words per element.
template <int N, typename T, int MINB, int OPT, bool ASM = false, bool AFF = false>
__global__ void __launch_bounds__(N * N * elements_per_block<N>(), MINB)
bk5_element_kernel(int64_t E, int C, bool l2, const T* __restrict__ u, const T* __restrict__ D,
                   const T* __restrict__ G, T* __restrict__ w, const int32_t* __restrict__ idx, int64_t nf) {
  constexpr int EB = elements_per_block<N>();
  constexpr int n2 = N * N, n3 = N * N * N;
  T* sD = reinterpret_cast<T*>(jaxsem_smem);  // sD[a*N + b] = D[a][b]
  T* sDt = sD + n2;                           // sDt[b*N + a] = D[a][b]
  const int i = threadIdx.x, j = threadIdx.y, z = threadIdx.z;
  T* U = sDt + n2 + z * 3 * n3;
  T* GR = U + n3;
  T* GS = GR + n3;
  const int lt = i + N * j;
  prefetch_block<EB>(l2, lt + n2 * z, E, ASM ? 0 : C, u, n3, G, AFF ? 0 : 6, E * n3, n3);
  for (int t = lt + n2 * z; t < n2; t += n2 * EB) {
    sD[t] = D[t];
    sDt[(t % N) * N + t / N] = D[t];
  }
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  const int64_t stride = E * n3;
  const int64_t base = (active ? e : 0) * n3;
  for (int c = 0; c < C; ++c) {
    __syncthreads();  // D loaded; the previous component's reads of U/GR/GS done
    if constexpr (ASM) {
      const T* uc = u + c * nf;
      const int32_t* ie = idx + base;
      for (int t = lt; t < n3; t += n2) {
        const uint32_t g = active ? uint32_t(ie[t]) : uint32_t(nf);
        U[t] = g < nf ? uc[g] : T(0);
      }
    } else {
      const T* uc = u + c * stride + base;
      for (int t = lt; t < n3; t += n2) U[t] = active ? uc[t] : T(0);
    }
    __syncthreads();
    T ru[N], rw[N];
#pragma unroll
    for (int m = 0; m < N; ++m) ru[m] = U[(m * N + j) * N + i];
    auto stage = [&](const auto& g) {
      if constexpr ((OPT & OPT_CONST) != 0)
        collocated_stage<N, T, OPT>(U, ru, sD, sDt, ConstOps<ops_offset(N)>{}, g, i, j, GR, GS, rw);
      else
        collocated_stage<N, T, OPT>(U, ru, sD, sDt, static_cast<const T*>(sD), g, i, j, GR, GS, rw);
    };
    if constexpr (AFF) {
      GAffine<T> g;
#pragma unroll
      for (int f = 0; f < 6; ++f) g.c[f] = active ? G[f * E + e] : T(0);
      g.w = D + n2;
      g.wab = D[n2 + i] * D[n2 + j];
      stage(g);
    } else {
      stage(GStored<N, T>{G + base + j * N + i, stride, active});
    }
    if (active) {
      if constexpr (ASM) {
        T* wc = w + c * nf;
        const int32_t* ie = idx + base + j * N + i;
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const uint32_t g = uint32_t(ie[k * n2]);
          if (g < nf) atomicAdd(wc + g, rw[k]);
        }
      } else {
        T* wc = w + c * stride + base + j * N + i;
#pragma unroll
        for (int k = 0; k < N; ++k) wc[k * n2] = rw[k];
      }
    }
  }
}

// Forward interpolation of a whole element: ue (global, N³) → rx[c] = (J⊗J⊗J u)[c][b][a]
// for thread (a, b) of the Q×Q layer. A: N²Q words, Bf: NQ² words of this element's shared
// region; sJ[c*N + k] = J[c][k].
template <int N, int Q, typename T, typename UOps>
__device__ __forceinline__ void forward_element(const T* __restrict__ ue, bool active, int a, int b,
                                                const T* sJ, UOps cJ, T* A, T* Bf, T (&rx)[Q]) {
  constexpr int n3 = N * N * N;
  __syncthreads();  // earlier readers of A/Bf are done
  for (int t = a + Q * b; t < n3; t += Q * Q) A[t] = active ? ue[t] : T(0);
  __syncthreads();
  if (b < N) {  // T1[k][b][a] = Σ_i J[a][i] U[k][b][i]
    T Ja[N];
#pragma unroll
    for (int m = 0; m < N; ++m) Ja[m] = sJ[a * N + m];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      T s = 0;
#pragma unroll
      for (int m = 0; m < N; ++m) s += Ja[m] * A[(k * N + b) * N + m];
      Bf[(k * N + b) * Q + a] = s;
    }
  }
  __syncthreads();
  T Jb[N], r[N];
#pragma unroll
  for (int m = 0; m < N; ++m) Jb[m] = sJ[b * N + m];
#pragma unroll
  for (int k = 0; k < N; ++k) {  // T2[k][b][a] = Σ_j J[b][j] T1[k][j][a]
    T s = 0;
#pragma unroll
    for (int m = 0; m < N; ++m) s += Jb[m] * Bf[(k * N + m) * Q + a];
    r[k] = s;
  }
#pragma unroll
  for (int c = 0; c < Q; ++c) {
    T s = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) s += cJ[c * N + k] * r[k];
    rx[c] = s;
  }
}

// Transposed interpolation of the Q-columns rv of an element back to N³, written to we.
template <int N, int Q, typename T, typename UOps>
__device__ __forceinline__ void back_element(T* __restrict__ we, bool active, int a, int b,
                                             const T* sJ, UOps cJ, T* A, T* Bf, const T (&rv)[Q]) {
  T ry[N];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    T s = 0;
#pragma unroll
    for (int c = 0; c < Q; ++c) s += cJ[c * N + k] * rv[c];
    ry[k] = s;
  }
  __syncthreads();  // earlier readers of Bf are done
#pragma unroll
  for (int k = 0; k < N; ++k) Bf[(k * Q + b) * Q + a] = ry[k];
  __syncthreads();
  if (a < N) {  // S1[k][b][i] = Σ_a J[a][i] S2[k][b][a], thread (i = a, b)
    T Ji[Q];
#pragma unroll
    for (int c = 0; c < Q; ++c) Ji[c] = sJ[c * N + a];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      T s = 0;
#pragma unroll
      for (int c = 0; c < Q; ++c) s += Ji[c] * Bf[(k * Q + b) * Q + c];
      A[(k * Q + b) * N + a] = s;
    }
  }
  __syncthreads();
  if (a < N && b < N) {  // w[k][j][i] = Σ_b J[b][j] S1[k][b][i], thread (i = a, j = b)
    T Jj[Q];
#pragma unroll
    for (int c = 0; c < Q; ++c) Jj[c] = sJ[c * N + b];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      T s = 0;
#pragma unroll
      for (int c = 0; c < Q; ++c) s += Jj[c] * A[(k * Q + c) * N + a];
      if (active) we[(k * N + b) * N + a] = s;
    }
  }
}

template <int N, int Q>
__host__ __device__ constexpr int mass_region() {
  return N * N * Q + N * Q * Q;
}

template <int N, int Q>
__host__ __device__ constexpr int stiffness_region() {
  return 3 * Q * Q * Q > mass_region<N, Q>() ? 3 * Q * Q * Q : mass_region<N, Q>();
}

// BK3/BK4 variants 2 (MINB 0) and 3 (MINB 2): operator matrices from shared memory.
template <int N, int Q, typename T, int MINB>
__global__ void __launch_bounds__(Q * Q * elements_per_block<Q>(), MINB)
stiffness_element_kernel(int64_t E, int C, bool l2, const T* __restrict__ u, const T* __restrict__ J,
                         const T* __restrict__ Dq, const T* __restrict__ G, T* __restrict__ w) {
  constexpr int EB = elements_per_block<Q>();
  constexpr int64_t n3 = N * N * N, q3 = Q * Q * Q;
  T* sJ = reinterpret_cast<T*>(jaxsem_smem);
  T* sD = sJ + Q * N;    // sD[a*Q + b] = Dq[a][b]
  T* sDt = sD + Q * Q;   // sDt[b*Q + a] = Dq[a][b]
  const int a = threadIdx.x, b = threadIdx.y, z = threadIdx.z;
  T* R = sDt + Q * Q + z * stiffness_region<N, Q>();
  T* A = R;
  T* Bf = R + N * N * Q;
  T* X = R;
  T* GR = R + q3;
  T* GS = R + 2 * q3;
  const int tid = a + Q * (b + Q * z);
  prefetch_block<EB>(l2, tid, E, C, u, n3, G, 6, E * q3, q3);
  for (int t = tid; t < Q * N; t += Q * Q * EB) sJ[t] = J[t];
  for (int t = tid; t < Q * Q; t += Q * Q * EB) {
    sD[t] = Dq[t];
    sDt[(t % Q) * Q + t / Q] = Dq[t];
  }
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  const int64_t ee = active ? e : 0;
  const int64_t gstride = E * q3;
  for (int c = 0; c < C; ++c) {
    T rx[Q], rw[Q];
    forward_element<N, Q, T>(u + (c * E + ee) * n3, active, a, b, sJ, static_cast<const T*>(sJ), A, Bf, rx);
    __syncthreads();  // forward's reads of Bf done before X overwrites the region
#pragma unroll
    for (int k = 0; k < Q; ++k) X[(k * Q + b) * Q + a] = rx[k];
    __syncthreads();
    collocated_stage<Q, T, 0>(X, rx, sD, sDt, static_cast<const T*>(sD), GStored<Q, T>{G + ee * q3 + b * Q + a, gstride, active},
                              a, b, GR, GS, rw);
    back_element<N, Q, T>(w + (c * E + ee) * n3, active, a, b, sJ, static_cast<const T*>(sJ), A, Bf, rw);
  }
}

// ================================================================ Gauss kernels by lines (8-11)
// The element kernel above contracts two of the three directions through shared memory: every
// output point reads a whole row of its input from shared memory (N or Q loads per point and
// direction), which keeps the L1/shared pipe busy. Here each thread owns a whole line of the
// direction being contracted, so every contraction runs in registers with J as constant-memory
// operands, and shared memory only transposes between the stages: each value is stored once and
// loaded once (4 transposes plus staging u in and w out, against 2·(N + Q) loads per point). Rows
// are padded to odd lengths, so a warp's threads reading their own lines hit distinct banks.
//   phase 1  (j, k) owns u[k][j][:]   -> X1[k][j][a]   (N² threads)
//   phase 2  (a, k) owns X1[k][:][a]  -> X2[k][b][a]   (QN)
//   phase 3  (a, b) owns X2[:][b][a]  -> V = B·X3, Y2[k][b][a] = Σ_c J[c][k] V[c][b][a]   (Q²)
//   phase 2' (a, k) owns Y2[k][:][a]  -> Y1[k][j][a]   (QN)
//   phase 1' (j, k) owns Y1[k][j][:]  -> w[k][j][i]    (N²)
__host__ __device__ constexpr int odd_len(int x) { return x | 1; }

template <int N, int Q>
__host__ __device__ constexpr int lines_a_words() {  // u staged, X2, Y1
  constexpr int RN = odd_len(N), RQ = odd_len(Q);
  constexpr int w1 = N * N * RN, w2 = Q * Q * RN, w3 = N * N * RQ;
  return w1 > w2 ? (w1 > w3 ? w1 : w3) : (w2 > w3 ? w2 : w3);
}

template <int N, int Q>
__host__ __device__ constexpr int lines_b_words() {  // X1, Y2, w staged
  constexpr int RN = odd_len(N), RQ = odd_len(Q);
  constexpr int w1 = N * Q * RN, w2 = N * Q * RQ, w3 = N * N * RN;
  return w1 > w2 ? (w1 > w3 ? w1 : w3) : (w2 > w3 ? w2 : w3);
}

// out[r] = Σ_s J[r][s] in[s] (J: R×S, row-major in constant memory at OFF)
template <int R, int S, int OFF>
__device__ __forceinline__ void cmul(const JAXSEM_REAL (&in)[S], JAXSEM_REAL (&out)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    JAXSEM_REAL acc = 0;
#pragma unroll
    for (int q = 0; q < S; ++q) acc += c_ops[OFF + r * S + q] * in[q];
    out[r] = acc;
  }
}

// out[s] = Σ_r J[r][s] in[r]
template <int R, int S, int OFF>
__device__ __forceinline__ void cmul_t(const JAXSEM_REAL (&in)[R], JAXSEM_REAL (&out)[S]) {
#pragma unroll
  for (int q = 0; q < S; ++q) {
    JAXSEM_REAL acc = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) acc += c_ops[OFF + r * S + q] * in[r];
    out[q] = acc;
  }
}

// The phases below (and in collocated_lines) repeat one pattern: load a line, contract it, store
// it. A shared helper for it changed ptxas' register allocation and cost up to 2.5x at some
// orders, so they stay written out.
// Forward interpolation by lines: ue (global, N³) → rx[c] = (J⊗J⊗J u)[c][b][a] for thread
// t = a + Q·b of the Q² threads of an element (phases 1-3 above). A: lines_a_words, S:
// lines_b_words of this element's shared memory. Barriers inside; on return A and S are free.
// ASM (assembled storage): ue is a component's (nf) vector of global nodes and ie the element's
// N³ global node numbers; a node outside [0, nf) (Dirichlet) reads 0.
template <int N, int Q, bool ASM = false>
__device__ __forceinline__ void lines_forward(const JAXSEM_REAL* __restrict__ ue, bool active, int t,
                                              JAXSEM_REAL* A, JAXSEM_REAL* S, JAXSEM_REAL (&rx)[Q],
                                              const int32_t* __restrict__ ie = nullptr, int64_t nf = 0) {
  using T = JAXSEM_REAL;
  constexpr int RN = odd_len(N), OFF = ops_offset(N), NT = Q * Q, n3 = N * N * N;
  __syncthreads();  // earlier readers of A and S are done
  if constexpr (ASM) {
    for (int x = t; x < n3; x += NT) {
      const uint32_t g = active ? uint32_t(ie[x]) : uint32_t(nf);
      A[(x / N) * RN + x % N] = g < nf ? ue[g] : T(0);
    }
  } else {
    for (int x = t; x < n3; x += NT) A[(x / N) * RN + x % N] = active ? ue[x] : T(0);
  }
  __syncthreads();
  if (t < N * N) {  // phase 1: thread (j, k) = (t % N, t / N)
    const int j = t % N, k = t / N;
    T in[N], out[Q];
#pragma unroll
    for (int i = 0; i < N; ++i) in[i] = A[t * RN + i];
    cmul<Q, N, OFF>(in, out);
#pragma unroll
    for (int a = 0; a < Q; ++a) S[(k * Q + a) * RN + j] = out[a];
  }
  __syncthreads();
  if (t < Q * N) {  // phase 2: thread (a, k) = (t % Q, t / Q)
    const int a = t % Q, k = t / Q;
    T in[N], out[Q];
#pragma unroll
    for (int j = 0; j < N; ++j) in[j] = S[(k * Q + a) * RN + j];
    cmul<Q, N, OFF>(in, out);
#pragma unroll
    for (int b = 0; b < Q; ++b) A[(b * Q + a) * RN + k] = out[b];
  }
  __syncthreads();
  T in[N];  // phase 3: thread (a, b) = (t % Q, t / Q)
#pragma unroll
  for (int k = 0; k < N; ++k) in[k] = A[t * RN + k];
  cmul<Q, N, OFF>(in, rx);
}

// Transposed interpolation by lines: thread t = a + Q·b holds rv[c] at (c, b, a); writes
// we = Jᵀ⊗Jᵀ⊗Jᵀ rv (N³). Barriers inside (the first one before it writes S). ASM: adds into
// the component's global vector we at the element's nodes ie (atomics; outside [0, nf) dropped).
template <int N, int Q, bool ASM = false>
__device__ __forceinline__ void lines_back(JAXSEM_REAL* __restrict__ we, bool active, int t, JAXSEM_REAL* A,
                                           JAXSEM_REAL* S, const JAXSEM_REAL (&rv)[Q],
                                           const int32_t* __restrict__ ie = nullptr, int64_t nf = 0) {
  using T = JAXSEM_REAL;
  constexpr int RN = odd_len(N), RQ = odd_len(Q), OFF = ops_offset(N), NT = Q * Q, n3 = N * N * N;
  const int a = t % Q, b = t / Q;
  T y[N];
  cmul_t<Q, N, OFF>(rv, y);  // phase 3': Y2[k][b][a]
  __syncthreads();           // earlier readers of S are done
#pragma unroll
  for (int k = 0; k < N; ++k) S[(k * Q + a) * RQ + b] = y[k];
  __syncthreads();
  if (t < Q * N) {  // phase 2': thread (a, k) = (t % Q, t / Q)
    const int a2 = t % Q, k = t / Q;
    T in[Q], out[N];
#pragma unroll
    for (int q = 0; q < Q; ++q) in[q] = S[(k * Q + a2) * RQ + q];
    cmul_t<Q, N, OFF>(in, out);
#pragma unroll
    for (int j = 0; j < N; ++j) A[(k * N + j) * RQ + a2] = out[j];
  }
  __syncthreads();
  if (t < N * N) {  // phase 1': thread (j, k) = (t % N, t / N)
    T in[Q], out[N];
#pragma unroll
    for (int q = 0; q < Q; ++q) in[q] = A[t * RQ + q];
    cmul_t<Q, N, OFF>(in, out);
#pragma unroll
    for (int i = 0; i < N; ++i) S[t * RN + i] = out[i];
  }
  __syncthreads();
  if constexpr (ASM) {
    if (active)
      for (int x = t; x < n3; x += NT) {
        const uint32_t g = uint32_t(ie[x]);
        if (g < nf) atomicAdd(we + g, S[(x / N) * RN + x % N]);
      }
  } else {
    if (active)
      for (int x = t; x < n3; x += NT) we[x] = S[(x / N) * RN + x % N];
  }
}

template <int N, int Q, int MINB>
__global__ void __launch_bounds__(Q * Q * elements_per_block<Q>(), MINB)
mass_lines_kernel(int64_t E, int C, bool l2, const JAXSEM_REAL* __restrict__ u, const JAXSEM_REAL* __restrict__ B,
                  JAXSEM_REAL* __restrict__ w) {
  using T = JAXSEM_REAL;
  constexpr int EB = elements_per_block<Q>();
  constexpr int n3 = N * N * N, q3 = Q * Q * Q;
  const int t = threadIdx.x + Q * threadIdx.y, z = threadIdx.z;
  T* A = reinterpret_cast<T*>(jaxsem_smem) + z * (lines_a_words<N, Q>() + lines_b_words<N, Q>());
  T* S = A + lines_a_words<N, Q>();
  prefetch_block<EB>(l2, t + Q * Q * z, E, C, u, n3, B, 1, 0, q3);
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  const int64_t ee = active ? e : 0;
  for (int c = 0; c < C; ++c) {
    T x[Q];
    lines_forward<N, Q>(u + (c * E + ee) * n3, active, t, A, S, x);
    const T* Bq = B + ee * q3 + t;
#pragma unroll
    for (int q = 0; q < Q; ++q) x[q] *= active ? Bq[q * Q * Q] : T(0);
    lines_back<N, Q>(w + (c * E + ee) * n3, active, t, A, S, x);
  }
}

// BK3/BK4 with the interpolations by lines around the collocated stage (OPT_CONST, or with
// OPT_ROWS the D rows in registers). ASM (assembled storage, op "stiffnessa"): u and w are (C, nf)
// vectors of global nodes and idx (E, n³) the global node of each local one, as for bk5a: the
// element gathers its input through idx and adds its output into w with atomics (w zeroed first).
template <int N, int Q, int MINB, int OPT = OPT_CONST, bool ASM = false>
__global__ void __launch_bounds__(Q * Q * elements_per_block<Q>(), MINB)
stiffness_lines_kernel(int64_t E, int C, bool l2, const JAXSEM_REAL* __restrict__ u, const JAXSEM_REAL* __restrict__ Dq,
                       const JAXSEM_REAL* __restrict__ G, JAXSEM_REAL* __restrict__ w,
                       const int32_t* __restrict__ idx = nullptr, int64_t nf = 0) {
  using T = JAXSEM_REAL;
  constexpr int EB = elements_per_block<Q>();
  constexpr int64_t n3 = N * N * N, q3 = Q * Q * Q;
  constexpr int lines = lines_a_words<N, Q>() + lines_b_words<N, Q>();
  constexpr int region = 3 * Q * Q * Q > lines ? 3 * Q * Q * Q : lines;
  T* sD = reinterpret_cast<T*>(jaxsem_smem);  // sD[a*Q + b] = Dq[a][b]
  T* sDt = sD + Q * Q;                        // sDt[b*Q + a] = Dq[a][b]
  const int a = threadIdx.x, b = threadIdx.y, z = threadIdx.z, t = a + Q * b;
  T* R = sDt + Q * Q + z * region;
  T* A = R;
  T* S = R + lines_a_words<N, Q>();
  T* X = R;
  T* GR = R + q3;
  T* GS = R + 2 * q3;
  prefetch_block<EB>(l2, t + Q * Q * z, E, ASM ? 0 : C, u, n3, G, 6, E * q3, q3);
  for (int x = t + Q * Q * z; x < Q * Q; x += Q * Q * EB) {
    sD[x] = Dq[x];
    sDt[(x % Q) * Q + x / Q] = Dq[x];
  }
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  const int64_t ee = active ? e : 0;
  const int64_t gstride = E * q3;
  for (int c = 0; c < C; ++c) {
    T rx[Q], rw[Q];
    if constexpr (ASM)
      lines_forward<N, Q, true>(u + c * nf, active, t, A, S, rx, idx + ee * n3, nf);
    else
      lines_forward<N, Q>(u + (c * E + ee) * n3, active, t, A, S, rx);
    __syncthreads();  // phase 3's reads of A done before X overwrites the region
#pragma unroll
    for (int k = 0; k < Q; ++k) X[(k * Q + b) * Q + a] = rx[k];
    __syncthreads();
    collocated_stage<Q, T, OPT>(X, rx, sD, sDt, ConstOps<ops_offset(N) + Q * N>{},
                                GStored<Q, T>{G + ee * q3 + t, gstride, active}, a, b, GR, GS, rw);
    if constexpr (ASM)
      lines_back<N, Q, true>(w + c * nf, active, t, A, S, rw, idx + ee * n3, nf);
    else
      lines_back<N, Q>(w + (c * E + ee) * n3, active, t, A, S, rw);
  }
}

// ============================================================== collocated stage by lines (BK5 8)
// The collocated stage with every contraction in registers: thread t = a + M·b owns the k-line
// (a, b) and, while the i- and j-derivatives are taken, also the i-line (t % M, t / M) = (b', k)
// and the j-line (a', k); shared memory only carries values between owners (each value stored
// once and loaded once per hand-over: 15 M³ words per element against (4M + 4) M³ for
// collocated_stage), D as constant-memory operands at OFFD. Four barriers instead of one, and more
// registers. P0…P3: four buffers of coll_words<M>() words; on entry P0 holds x as [k][b][a] (rows
// of odd length, coll_index) and a barrier has passed; x[] is thread t's k-line. On return
// rw[k] = (Σ_ab D_aᵀ G_ab D_b x)(k, b, a).
template <int M>
__host__ __device__ constexpr int coll_words() { return M * M * odd_len(M); }

template <int M>
__device__ __forceinline__ int coll_index(int k, int b, int a) { return (k * M + b) * odd_len(M) + a; }

template <int M, int OFFD>
__device__ __forceinline__ void collocated_lines(const JAXSEM_REAL (&x)[M], const JAXSEM_REAL* __restrict__ g,
                                                 int64_t gstride, bool active, int t, JAXSEM_REAL* P0,
                                                 JAXSEM_REAL* P1, JAXSEM_REAL* P2, JAXSEM_REAL* P3,
                                                 JAXSEM_REAL (&rw)[M]) {
  using T = JAXSEM_REAL;
  constexpr int m2 = M * M;
  const int p = t % M, q = t / M;  // i-line (b, k) = (p, q); j-line (a, k) = (p, q); k-line (a, b) = (p, q)
  {
    T in[M], out[M];
#pragma unroll
    for (int m = 0; m < M; ++m) in[m] = P0[coll_index<M>(q, p, m)];
    cmul<M, M, OFFD>(in, out);  // ur[k][b][a] = Σ_m D[a][m] x[k][b][m]
#pragma unroll
    for (int m = 0; m < M; ++m) P1[coll_index<M>(q, p, m)] = out[m];
#pragma unroll
    for (int m = 0; m < M; ++m) in[m] = P0[coll_index<M>(q, m, p)];
    cmul<M, M, OFFD>(in, out);  // us[k][b][a] = Σ_m D[b][m] x[k][m][a]
#pragma unroll
    for (int m = 0; m < M; ++m) P2[coll_index<M>(q, m, p)] = out[m];
  }
  __syncthreads();
  T gt[M];
  cmul<M, M, OFFD>(x, gt);  // ut, then the t-row of G·(ur, us, ut)
#pragma unroll
  for (int k = 0; k < M; ++k) {
    const T ur = P1[coll_index<M>(k, q, p)], us = P2[coll_index<M>(k, q, p)], ut = gt[k];
    T g0 = 0, g1 = 0, g2 = 0, g3 = 0, g4 = 0, g5 = 0;
    if (active) {
      const T* gk = g + k * m2;
      g0 = gk[0];
      g1 = gk[gstride];
      g2 = gk[2 * gstride];
      g3 = gk[3 * gstride];
      g4 = gk[4 * gstride];
      g5 = gk[5 * gstride];
    }
    P0[coll_index<M>(k, q, p)] = g0 * ur + g1 * us + g2 * ut;  // x's readers passed the barrier
    P3[coll_index<M>(k, q, p)] = g1 * ur + g3 * us + g4 * ut;
    gt[k] = g2 * ur + g4 * us + g5 * ut;
  }
  cmul_t<M, M, OFFD>(gt, rw);  // Σ_k D[k][m] gt[k]
  __syncthreads();
  {
    T in[M], out[M];
#pragma unroll
    for (int m = 0; m < M; ++m) in[m] = P0[coll_index<M>(q, p, m)];
    cmul_t<M, M, OFFD>(in, out);  // Σ_a D[a][i] gr[k][b][a]
#pragma unroll
    for (int m = 0; m < M; ++m) P1[coll_index<M>(q, p, m)] = out[m];
#pragma unroll
    for (int m = 0; m < M; ++m) in[m] = P3[coll_index<M>(q, m, p)];
    cmul_t<M, M, OFFD>(in, out);  // Σ_b D[b][j] gs[k][b][a]
#pragma unroll
    for (int m = 0; m < M; ++m) P2[coll_index<M>(q, m, p)] = out[m];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < M; ++k) rw[k] += P1[coll_index<M>(k, q, p)] + P2[coll_index<M>(k, q, p)];
}

template <int N, int MINB>
__global__ void __launch_bounds__(N * N * elements_per_block<N>(), MINB)
bk5_lines_kernel(int64_t E, int C, bool l2, const JAXSEM_REAL* __restrict__ u, const JAXSEM_REAL* __restrict__ G,
                 JAXSEM_REAL* __restrict__ w) {
  using T = JAXSEM_REAL;
  constexpr int EB = elements_per_block<N>();
  constexpr int n2 = N * N, n3 = N * N * N;
  const int i = threadIdx.x, j = threadIdx.y, z = threadIdx.z, t = i + N * j;
  T* P0 = reinterpret_cast<T*>(jaxsem_smem) + z * 4 * coll_words<N>();
  T* P1 = P0 + coll_words<N>();
  T* P2 = P1 + coll_words<N>();
  T* P3 = P2 + coll_words<N>();
  prefetch_block<EB>(l2, t + n2 * z, E, C, u, n3, G, 6, E * n3, n3);
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  const int64_t stride = E * n3;
  const int64_t base = (active ? e : 0) * n3 + t;
  for (int c = 0; c < C; ++c) {
    T x[N], rw[N];
    const T* uc = u + c * stride + base;
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = active ? uc[k * n2] : T(0);
    __syncthreads();  // the previous component's readers of P0…P3 are done
#pragma unroll
    for (int k = 0; k < N; ++k) P0[coll_index<N>(k, j, i)] = x[k];
    __syncthreads();
    collocated_lines<N, ops_offset(N)>(x, G + base, stride, active, t, P0, P1, P2, P3, rw);
    if (active) {
      T* wc = w + c * stride + base;
#pragma unroll
      for (int k = 0; k < N; ++k) wc[k * n2] = rw[k];
    }
  }
}

// ------------------------------------------------------------------------- Maxwell (DG)
// The right-hand side of the SEDG Maxwell system (jaxsem/models/maxwell.py, rhs with
// form="chain") in one pass: the chain-rule curls Σ_a ∇r_a × ∂_a F of E and H, the face
// fluxes with the neighbour's values read straight from q through nbr (no face arrays, no
// exchange), the lift, and the division by ε, μ:
//   ε dE/dt = ∇×H + Σ_faces [cE n×ΔH − aE n×(n×ΔE)],  μ dH/dt = −∇×E + Σ_faces [−cH n×ΔE − aH n×(n×ΔH)]
// (the a-terms only with the upwind flux), ΔF = F⁺ − F⁻, F⁺ the mirror state on the boundary
// (PEC: E⁺ = −E⁻, H⁺ = H⁻; PMC the other way round). Arrays: q, w (6, E, n³) [Ex Ey Ez Hx Hy Hz];
// rx (3, 3, E, n³) = ∂r_a/∂x_d; eps, mu (E, n³); normal (3, E, 6, n²); cE, aE, cH, aH (E, 6, n²);
// nbr (E, 6, n²) int32, the volume index e'·n³ + node of the neighbour's coinciding node (-1 on
// the boundary). Faces [v, u]: 0/1 (i = 0/N) [k, j], 2/3 (j = 0/N) [k, i], 4/5 (k = 0/N) [j, i].
// One element per N×N thread layer, the six fields in shared memory, thread (i, j) walks its
// column k.
struct MaxwellArgs {
  const JAXSEM_REAL *q, *D, *rx, *eps, *mu, *normal, *cE, *aE, *cH, *aH;
  const int32_t* nbr;
  JAXSEM_REAL* w;  // dq/dt
  int64_t E;
  bool upwind, pmc;
};

template <int N, typename T>
__device__ __forceinline__ void cross_add(T s, const T (&a)[3], const T (&b)[3], T (&out)[3]) {
  out[0] += s * (a[1] * b[2] - a[2] * b[1]);
  out[1] += s * (a[2] * b[0] - a[0] * b[2]);
  out[2] += s * (a[0] * b[1] - a[1] * b[0]);
}

// The material adjoint (cuda.maxwell_material_vjp_cuda): for a cotangent lam (6, E, n³) of dq/dt,
// the cotangents of eps, mu (E, n³) and of the flux coefficients cE, aE, cH, aH (E, 6, n²) at
// fixed q: with dq/dt_E = (∇×H + Σ_f [cE n×ΔH − aE n×(n×ΔE)])/ε (and H alike),
//   g_eps = −lam_E·(dq/dt)_E/ε,  g_cE = lam_E·(n×ΔH)/ε,  g_aE = −lam_E·(n×(n×ΔE))/ε,
//   g_mu = −lam_H·(dq/dt)_H/μ,   g_cH = −lam_H·(n×ΔE)/μ,  g_aH = −lam_H·(n×(n×ΔH))/μ
// (a-terms 0 with the central flux): the right-hand side computed as maxwell_kernel does and
// contracted with lam in place, instead of written out.
struct MaxwellMatArgs {
  const JAXSEM_REAL* lam;
  JAXSEM_REAL* gnode;  // (2, E, n³): g_eps, g_mu
  JAXSEM_REAL* gface;  // (4, E, 6, n²): g_cE, g_aE, g_cH, g_aH
};

template <int N, typename T>
__device__ __forceinline__ T dot3(const T (&a)[3], const T (&b)[3]) {
  return a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
}

// MAT: also write the face point's flux-coefficient cotangents (lE = lam_E/ε, lH = lam_H/μ).
template <int N, typename T, bool MAT = false>
__device__ __forceinline__ void maxwell_face(const MaxwellArgs& A, const T* U, int64_t e, int f, int v, int u,
                                             int node, T (&sE)[3], T (&sH)[3],
                                             const MaxwellMatArgs* M = nullptr, const T* lE = nullptr,
                                             const T* lH = nullptr) {
  constexpr int n2 = N * N, n3 = N * N * N;
  const int64_t fp = (e * 6 + f) * n2 + v * N + u, fstride = A.E * 6 * n2;
  const int64_t stride = A.E * n3;
  const int32_t nb = A.nbr[fp];
  T dE[3], dH[3];
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const T oE = U[c * n3 + node], oH = U[(c + 3) * n3 + node];
    T pE, pH;
    if (nb >= 0) {
      pE = A.q[c * stride + nb];
      pH = A.q[(c + 3) * stride + nb];
    } else {
      pE = A.pmc ? oE : -oE;
      pH = A.pmc ? -oH : oH;
    }
    dE[c] = pE - oE;
    dH[c] = pH - oH;
  }
  const T nv[3] = {A.normal[fp], A.normal[fstride + fp], A.normal[2 * fstride + fp]};
  T nxdE[3] = {0, 0, 0}, nxdH[3] = {0, 0, 0};
  cross_add<N, T>(T(1), nv, dE, nxdE);
  cross_add<N, T>(T(1), nv, dH, nxdH);
  const T cE = A.cE[fp], cH = A.cH[fp];
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    sE[c] += cE * nxdH[c];
    sH[c] -= cH * nxdE[c];
  }
  if (A.upwind) {
    cross_add<N, T>(-A.aE[fp], nv, nxdE, sE);
    cross_add<N, T>(-A.aH[fp], nv, nxdH, sH);
  }
  if constexpr (MAT) {
    const int64_t gstride = A.E * 6 * n2;
    const T le[3] = {lE[0], lE[1], lE[2]}, lh[3] = {lH[0], lH[1], lH[2]};
    M->gface[fp] = dot3<N, T>(le, nxdH);
    M->gface[2 * gstride + fp] = -dot3<N, T>(lh, nxdE);
    T nnE[3] = {0, 0, 0}, nnH[3] = {0, 0, 0};
    if (A.upwind) {
      cross_add<N, T>(T(1), nv, nxdE, nnE);
      cross_add<N, T>(T(1), nv, nxdH, nnH);
    }
    M->gface[gstride + fp] = -dot3<N, T>(le, nnE);
    M->gface[3 * gstride + fp] = -dot3<N, T>(lh, nnH);
  }
}

// Blocks per multiprocessor the Maxwell kernel asks registers for (__launch_bounds__): the material
// adjoint holds the cotangent too, and uncapped it takes so many registers that one block runs where
// shared memory has room for two; capped for two wherever their shared memory fits (227 KB).
template <int N, typename T, bool MAT>
__host__ __device__ constexpr int maxwell_min_blocks() {
  return MAT && 2 * sizeof(T) * (N * N + elements_per_block<N>() * 6 * N * N * N) <= 227 * 1024 ? 2 : 1;
}

// The derivatives of the three directions in one loop over m, not unrolled: 18 independent sums
// in flight per thread (where few warps share a multiprocessor, large n, that latency hiding is
// what counts), about 115 registers (N = 8, 15). MAT: the material adjoint above instead of dq/dt
// (M: its arrays).
template <int N, typename T, bool MAT = false>
__global__ void __launch_bounds__(N * N * elements_per_block<N>(), maxwell_min_blocks<N, T, MAT>())
    maxwell_kernel(MaxwellArgs A, MaxwellMatArgs M = {}) {
  constexpr int EB = elements_per_block<N>();
  constexpr int n2 = N * N, n3 = N * N * N;
  T* sD = reinterpret_cast<T*>(jaxsem_smem);  // sD[a*N + b] = D[a][b]
  const int i = threadIdx.x, j = threadIdx.y, z = threadIdx.z;
  T* U = sD + n2 + z * 6 * n3;
  const int lt = i + N * j;
  for (int t = lt + n2 * z; t < n2; t += n2 * EB) sD[t] = A.D[t];
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < A.E;
  const int64_t stride = A.E * n3;
  const int64_t base = (active ? e : 0) * n3;
#pragma unroll
  for (int c = 0; c < 6; ++c)
    for (int t = lt; t < n3; t += n2) U[c * n3 + t] = active ? A.q[c * stride + base + t] : T(0);
  __syncthreads();
  if (!active) return;
  for (int k = 0; k < N; ++k) {
    const int node = (k * N + j) * N + i;
    T curl[6] = {0, 0, 0, 0, 0, 0};  // ∇×E, ∇×H
    T dd[3][6] = {};                  // ∂_a of the six fields
#pragma unroll 1
    for (int m = 0; m < N; ++m) {
      const T D0 = sD[i * N + m], D1 = sD[j * N + m], D2 = sD[k * N + m];
      const int a0 = (k * N + j) * N + m, a1 = (k * N + m) * N + i, a2 = (m * N + j) * N + i;
#pragma unroll
      for (int c = 0; c < 6; ++c) {
        dd[0][c] += D0 * U[c * n3 + a0];
        dd[1][c] += D1 * U[c * n3 + a1];
        dd[2][c] += D2 * U[c * n3 + a2];
      }
    }
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const T r[3] = {A.rx[(a * 3 + 0) * stride + base + node], A.rx[(a * 3 + 1) * stride + base + node],
                      A.rx[(a * 3 + 2) * stride + base + node]};
      const T dE[3] = {dd[a][0], dd[a][1], dd[a][2]}, dH[3] = {dd[a][3], dd[a][4], dd[a][5]};
      T cEv[3] = {curl[0], curl[1], curl[2]}, cHv[3] = {curl[3], curl[4], curl[5]};
      cross_add<N, T>(T(1), r, dE, cEv);
      cross_add<N, T>(T(1), r, dH, cHv);
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        curl[c] = cEv[c];
        curl[c + 3] = cHv[c];
      }
    }
    T sE[3] = {0, 0, 0}, sH[3] = {0, 0, 0};
    // 1/ε, 1/μ ahead of the face branches: their loads are in flight during them
    const T ie = T(1) / A.eps[base + node], im = T(1) / A.mu[base + node];
    T lE[3] = {0, 0, 0}, lH[3] = {0, 0, 0};
    if constexpr (MAT) {
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        lE[c] = M.lam[c * stride + base + node] * ie;
        lH[c] = M.lam[(c + 3) * stride + base + node] * im;
      }
    }
    if (i == 0) maxwell_face<N, T, MAT>(A, U, e, 0, k, j, node, sE, sH, &M, lE, lH);
    if (i == N - 1) maxwell_face<N, T, MAT>(A, U, e, 1, k, j, node, sE, sH, &M, lE, lH);
    if (j == 0) maxwell_face<N, T, MAT>(A, U, e, 2, k, i, node, sE, sH, &M, lE, lH);
    if (j == N - 1) maxwell_face<N, T, MAT>(A, U, e, 3, k, i, node, sE, sH, &M, lE, lH);
    if (k == 0) maxwell_face<N, T, MAT>(A, U, e, 4, j, i, node, sE, sH, &M, lE, lH);
    if (k == N - 1) maxwell_face<N, T, MAT>(A, U, e, 5, j, i, node, sE, sH, &M, lE, lH);
    if constexpr (MAT) {
      T ge = 0, gm = 0;
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        ge -= lE[c] * (curl[c + 3] + sE[c]) * ie;
        gm -= lH[c] * (sH[c] - curl[c]) * im;
      }
      M.gnode[base + node] = ge;
      M.gnode[stride + base + node] = gm;
    } else {
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        A.w[c * stride + base + node] = (curl[c + 3] + sE[c]) * ie;
        A.w[(c + 3) * stride + base + node] = (sH[c] - curl[c]) * im;
      }
    }
  }
}

template <int N, typename T, bool MAT = false>
bool launch_maxwell(cudaStream_t st, int variant, const MaxwellArgs& A, const MaxwellMatArgs& M = {}) {
  constexpr int EB = elements_per_block<N>();
  dim3 block(N, N, EB), grid(unsigned((A.E + EB - 1) / EB));
  const size_t smem = sizeof(T) * (N * N + EB * 6 * N * N * N);
  switch (variant) {
    case 2: {
      auto kernel = maxwell_kernel<N, T, MAT>;
      allow_smem(kernel, smem);
      kernel<<<grid, block, smem, st>>>(A, M);
      return true;
    }
    default: return false;
  }
}

// ------------------------------------------------------------------------- advection (DG)
// The right-hand side of DG linear advection (jaxsem/models/advection.py, rhs on one device) in
// one pass: the volume term of the chosen form, the upwind or central flux with the neighbour's
// value read straight from u through nbr (no face arrays, no exchange), the lift and 1/J:
//   du/dt = Σ_faces lw [an u⁻ − f*] − vol / J,   f* = vn (u⁻ + u⁺)/2 [+ |vn| (u⁻ − u⁺)/2, upwind]
//   vol = Σ_a A_a ∂_a u ("chain"), Σ_a ∂_a(A_a u) ("conservative") or their average ("split"),
// u⁺ = 0 (inflow) on the boundary. Arrays: u, w (E, n³); A (3, E, n³) the contravariant velocity
// c·J∇r_a; jac (E, n³); an, vn, lw (E, 6, n²) the Transport's face weights; nbr (E, 6, n²) int32
// as for Maxwell. Faces [v, u] as for Maxwell. One element per N×N thread layer, u (and with a
// conservative half A_a, read from memory once for both halves) in shared memory, thread (i, j)
// walks its column k.
constexpr int ADV_SPLIT = 0, ADV_CONSERVATIVE = 1, ADV_CHAIN = 2;  // cuda.ADVECTION_FORMS order

struct AdvectionArgs {
  const JAXSEM_REAL *u, *D, *A, *jac, *an, *vn, *lw;
  const int32_t* nbr;
  JAXSEM_REAL* w;  // du/dt
  int64_t E;
  bool upwind;
};

// words of shared memory per element node: u, and A_0 u, A_1 u, A_2 u for a conservative half
template <int FORM>
__host__ __device__ constexpr int advection_words() { return FORM == ADV_CHAIN ? 1 : 4; }

// lw (an u⁻ − f*) at face point (f, v, u) of element e, u⁻ = uf
template <int N, typename T>
__device__ __forceinline__ T advection_face(const AdvectionArgs& A, T uf, int64_t e, int f, int v, int u) {
  constexpr int n2 = N * N;
  const int64_t fp = (e * 6 + f) * n2 + v * N + u;
  const int32_t nb = A.nbr[fp];
  const T up = nb >= 0 ? A.u[nb] : T(0);
  const T vn = A.vn[fp];
  T fstar = T(0.5) * vn * (uf + up);
  if (A.upwind) fstar += T(0.5) * fabs(vn) * (uf - up);
  return A.lw[fp] * (A.an[fp] * uf - fstar);
}

// FORM: ADV_SPLIT, ADV_CONSERVATIVE or ADV_CHAIN. The derivatives of the three directions in one
// loop over m, unrolled by two: 6 or 12 independent sums in flight per thread.
template <int N, typename T, int FORM>
__global__ void __launch_bounds__(N * N * elements_per_block<N>()) advection_kernel(AdvectionArgs A) {
  constexpr int EB = elements_per_block<N>();
  constexpr int n2 = N * N, n3 = N * N * N;
  constexpr bool CONS = FORM != ADV_CHAIN, CHAIN = FORM != ADV_CONSERVATIVE;
  T* sD = reinterpret_cast<T*>(jaxsem_smem);  // sD[a*N + b] = D[a][b]
  const int i = threadIdx.x, j = threadIdx.y, z = threadIdx.z;
  T* U = sD + n2 + z * advection_words<FORM>() * n3;  // u, then (split, conservative) A_a at U + (a + 1) n3
  const int lt = i + N * j;
  for (int t = lt + n2 * z; t < n2; t += n2 * EB) sD[t] = A.D[t];
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < A.E;
  const int64_t stride = A.E * n3;
  const int64_t base = (active ? e : 0) * n3;
  for (int t = lt; t < n3; t += n2) {
    const T ut = active ? A.u[base + t] : T(0);
    U[t] = ut;
    if constexpr (CONS) {
#pragma unroll
      for (int a = 0; a < 3; ++a) U[(a + 1) * n3 + t] = active ? A.A[a * stride + base + t] : T(0);
    }
  }
  __syncthreads();
  if (!active) return;
  for (int k = 0; k < N; ++k) {
    const int node = (k * N + j) * N + i;
    T chain = 0, cons = 0;  // Σ_a A_a ∂_a u, Σ_a ∂_a(A_a u)
    T du[3] = {0, 0, 0}, dau[3] = {0, 0, 0};  // ∂_a u, ∂_a(A_a u)
#pragma unroll 2
    for (int m = 0; m < N; ++m) {
      const int at[3] = {(k * N + j) * N + m, (k * N + m) * N + i, (m * N + j) * N + i};
      const T Dm[3] = {sD[i * N + m], sD[j * N + m], sD[k * N + m]};
#pragma unroll
      for (int a = 0; a < 3; ++a) {
        if constexpr (CHAIN) du[a] += Dm[a] * U[at[a]];
        if constexpr (CONS) dau[a] += Dm[a] * (U[(a + 1) * n3 + at[a]] * U[at[a]]);  // (A_a u) at node at
      }
    }
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      // A_a at the node: from shared memory where it is staged (one global read of A, not two)
      if constexpr (CHAIN) chain += (CONS ? U[(a + 1) * n3 + node] : A.A[a * stride + base + node]) * du[a];
      if constexpr (CONS) cons += dau[a];
    }
    const T vol = FORM == ADV_SPLIT ? T(0.5) * (cons + chain) : CONS ? cons : chain;
    const T uf = U[node];
    T s = 0;
    if (i == 0) s += advection_face<N, T>(A, uf, e, 0, k, j);
    if (i == N - 1) s += advection_face<N, T>(A, uf, e, 1, k, j);
    if (j == 0) s += advection_face<N, T>(A, uf, e, 2, k, i);
    if (j == N - 1) s += advection_face<N, T>(A, uf, e, 3, k, i);
    if (k == 0) s += advection_face<N, T>(A, uf, e, 4, j, i);
    if (k == N - 1) s += advection_face<N, T>(A, uf, e, 5, j, i);
    A.w[base + node] = s - vol / A.jac[base + node];
  }
}

template <int N, typename T>
bool launch_advection(cudaStream_t st, int variant, int form, const AdvectionArgs& A) {
  constexpr int EB = elements_per_block<N>();
  dim3 block(N, N, EB), grid(unsigned((A.E + EB - 1) / EB));
  auto one = [&](auto f) {
    constexpr int FORM = decltype(f)::value;
    const size_t smem = sizeof(T) * (N * N + EB * advection_words<FORM>() * N * N * N);
    auto kernel = advection_kernel<N, T, FORM>;
    allow_smem(kernel, smem);
    kernel<<<grid, block, smem, st>>>(A);
    return true;
  };
  switch (variant) {
    case 2:
      if (form == ADV_SPLIT) return one(std::integral_constant<int, ADV_SPLIT>{});
      if (form == ADV_CONSERVATIVE) return one(std::integral_constant<int, ADV_CONSERVATIVE>{});
      if (form == ADV_CHAIN) return one(std::integral_constant<int, ADV_CHAIN>{});
      return false;
    default: return false;
  }
}

// ------------------------------------------------------------------------- dispatch
template <typename T>
struct Launch {
  cudaStream_t stream;
  int64_t E;
  int C;
  bool l2;  // prefetch_block (the variant attribute's bit PREFETCH_L2; not variant 1)
};

template <typename K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

template <int V>
using Int = std::integral_constant<int, V>;

#if defined(JAXSEM_OP_CONV) || defined(JAXSEM_OP_CONVT)
// ================================================================ dealiased convection
// The element-local part of the Navier–Stokes convective term on the 3/2 rule (q = ceil(3n/2)):
//   w_m = Jᵀ⊗Jᵀ⊗Jᵀ [ Σ_a v_a ⊙ (∂_a c_m)_q ],   v_a = Σ_d Brx[a][d] ⊙ (J⊗J⊗J u_d),
// (∂_r c)_q = (J⊗J⊗Dd) c, (∂_s c)_q = (J⊗Dd⊗J) c, (∂_t c)_q = (Dd⊗J⊗J) c; u (3, E, n³) the
// carrier, c and w (M, E, n³) the carried fields, Brx (3, 3, E, q³) B·∂r_a/∂x_d on the rule.
// Every transform runs by lines (lines_forward's phases, one matrix per direction; J and Dd in
// constant memory); thread t = a + Q·b keeps the column (·, b, a) of v_0..2 and of the sum in
// registers, so the rule's fields never leave the chip: u and c are read once, Brx once, w written
// once. The einsum form is jaxsem.operators.convection.advection_local.

// One transform by lines of the element staged in U (N² rows of RN words): rx[k] at (k, b, a) of
// (M3⊗M2⊗M1) u with M1 along i (r), M2 along j (s), M3 along k (t), each at its constant-memory
// offset. A, S as lines_forward's; barriers inside (the first one also publishes U).
template <int N, int Q, int O1, int O2, int O3>
__device__ __forceinline__ void conv_forward(const JAXSEM_REAL* U, int t, JAXSEM_REAL* A, JAXSEM_REAL* S,
                                             JAXSEM_REAL (&rx)[Q]) {
  using T = JAXSEM_REAL;
  constexpr int RN = odd_len(N);
  __syncthreads();  // U staged; earlier readers of A and S are done
  if (t < N * N) {  // phase 1: thread (j, k) = (t % N, t / N) contracts i
    const int j = t % N, k = t / N;
    T in[N], out[Q];
#pragma unroll
    for (int i = 0; i < N; ++i) in[i] = U[t * RN + i];
    cmul<Q, N, O1>(in, out);
#pragma unroll
    for (int a = 0; a < Q; ++a) S[(k * Q + a) * RN + j] = out[a];
  }
  __syncthreads();
  if (t < Q * N) {  // phase 2: thread (a, k) = (t % Q, t / Q) contracts j
    const int a = t % Q, k = t / Q;
    T in[N], out[Q];
#pragma unroll
    for (int j = 0; j < N; ++j) in[j] = S[(k * Q + a) * RN + j];
    cmul<Q, N, O2>(in, out);
#pragma unroll
    for (int b = 0; b < Q; ++b) A[(b * Q + a) * RN + k] = out[b];
  }
  __syncthreads();
  T in[N];  // phase 3: thread (a, b) = (t % Q, t / Q) contracts k
#pragma unroll
  for (int k = 0; k < N; ++k) in[k] = A[t * RN + k];
  cmul<Q, N, O3>(in, rx);
}

template <int N>
__host__ __device__ constexpr int conv_q() {
  return (3 * N + 1) / 2;
}

template <int N>
__host__ __device__ constexpr int conv_words() {  // U, A, S of one element
  return N * N * odd_len(N) + lines_a_words<N, conv_q<N>()>() + lines_b_words<N, conv_q<N>()>();
}

// One field of the element (N³ words at src + ee·N³) into U, rows padded; 0 for an inactive layer.
template <int N>
__device__ __forceinline__ void conv_stage(const JAXSEM_REAL* __restrict__ src, int64_t ee, bool active, int t,
                                           JAXSEM_REAL* U) {
  constexpr int RN = odd_len(N), n3 = N * N * N, q2 = conv_q<N>() * conv_q<N>();
  for (int x = t; x < n3; x += q2) U[(x / N) * RN + x % N] = active ? src[ee * n3 + x] : JAXSEM_REAL(0);
}

// The carrier on the rule times B·∂r/∂x: v[a][k] = Σ_d Brx[a][d] ⊙ (J⊗J⊗J u_d) at (k, b, a) for
// thread t = a + Q·b (u: (3, E, N³), Brx: (3, 3, E, Q³)). Barriers inside.
template <int N>
__device__ __forceinline__ void conv_carrier(const JAXSEM_REAL* __restrict__ u, const JAXSEM_REAL* __restrict__ Brx,
                                             int64_t E, int64_t ee, bool active, int t, JAXSEM_REAL* U,
                                             JAXSEM_REAL* A, JAXSEM_REAL* S, JAXSEM_REAL (&v)[3][conv_q<N>()]) {
  using T = JAXSEM_REAL;
  constexpr int Q = conv_q<N>(), n3 = N * N * N, q2 = Q * Q, q3 = Q * Q * Q, OJ = ops_offset(N);
#pragma unroll
  for (int a = 0; a < 3; ++a)
#pragma unroll
    for (int k = 0; k < Q; ++k) v[a][k] = 0;
  for (int d = 0; d < 3; ++d) {
    T x[Q];
    conv_stage<N>(u + d * E * n3, ee, active, t, U);
    conv_forward<N, Q, OJ, OJ, OJ>(U, t, A, S, x);
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const T* g = Brx + ((a * 3 + d) * E + ee) * int64_t(q3) + t;
#pragma unroll
      for (int k = 0; k < Q; ++k) v[a][k] += (active ? g[k * q2] : T(0)) * x[k];
    }
  }
}

template <int N>
__global__ void __launch_bounds__(conv_q<N>() * conv_q<N>() * elements_per_block<conv_q<N>()>())
conv_kernel(int64_t E, int M, const JAXSEM_REAL* __restrict__ c, const JAXSEM_REAL* __restrict__ u,
            const JAXSEM_REAL* __restrict__ Brx, JAXSEM_REAL* __restrict__ w) {
  using T = JAXSEM_REAL;
  constexpr int Q = conv_q<N>(), EB = elements_per_block<Q>(), RN = odd_len(N);
  constexpr int n3 = N * N * N;
  constexpr int OJ = ops_offset(N), OD = ops_offset(N) + Q * N;
  const int t = threadIdx.x + Q * threadIdx.y, z = threadIdx.z;
  T* U = reinterpret_cast<T*>(jaxsem_smem) + z * conv_words<N>();
  T* A = U + N * N * RN;
  T* S = A + lines_a_words<N, Q>();
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  const int64_t ee = active ? e : 0;
  T v[3][Q];
  conv_carrier<N>(u, Brx, E, ee, active, t, U, A, S, v);
  for (int m = 0; m < M; ++m) {
    T acc[Q], x[Q];
    conv_stage<N>(c + int64_t(m) * E * n3, ee, active, t, U);
    conv_forward<N, Q, OD, OJ, OJ>(U, t, A, S, x);
#pragma unroll
    for (int k = 0; k < Q; ++k) acc[k] = v[0][k] * x[k];
    conv_forward<N, Q, OJ, OD, OJ>(U, t, A, S, x);
#pragma unroll
    for (int k = 0; k < Q; ++k) acc[k] += v[1][k] * x[k];
    conv_forward<N, Q, OJ, OJ, OD>(U, t, A, S, x);
#pragma unroll
    for (int k = 0; k < Q; ++k) acc[k] += v[2][k] * x[k];
    lines_back<N, Q>(w + (int64_t(m) * E + ee) * n3, active, t, A, S, acc);
  }
}

#if defined(JAXSEM_OP_CONVT)
// The transposed transform by lines, added into a line: thread t < N² (line (j, k) = (t % N, t / N))
// adds (M3ᵀ⊗M2ᵀ⊗M1ᵀ rv)[k][j][:] into acc[], where thread t = a + Q·b holds rv[c] at (c, b, a).
// Barriers inside (lines_back's phases 3', 2', 1'), none after: A is read last.
template <int N, int Q, int O1, int O2, int O3>
__device__ __forceinline__ void conv_back_add(int t, JAXSEM_REAL* A, JAXSEM_REAL* S, const JAXSEM_REAL (&rv)[Q],
                                              JAXSEM_REAL (&acc)[N]) {
  using T = JAXSEM_REAL;
  constexpr int RQ = odd_len(Q);
  const int a = t % Q, b = t / Q;
  T y[N];
  cmul_t<Q, N, O3>(rv, y);  // phase 3': contracts k
  __syncthreads();          // earlier readers of S are done
#pragma unroll
  for (int k = 0; k < N; ++k) S[(k * Q + a) * RQ + b] = y[k];
  __syncthreads();
  if (t < Q * N) {  // phase 2': thread (a, k) contracts j
    const int a2 = t % Q, k = t / Q;
    T in[Q], out[N];
#pragma unroll
    for (int q = 0; q < Q; ++q) in[q] = S[(k * Q + a2) * RQ + q];
    cmul_t<Q, N, O2>(in, out);
#pragma unroll
    for (int j = 0; j < N; ++j) A[(k * N + j) * RQ + a2] = out[j];
  }
  __syncthreads();
  if (t < N * N) {  // phase 1': thread (j, k) contracts i
    T in[Q], out[N];
#pragma unroll
    for (int q = 0; q < Q; ++q) in[q] = A[t * RQ + q];
    cmul_t<Q, N, O1>(in, out);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] += out[i];
  }
}

// The transpose of the convection's linearization in (c, u) (conv_kernel's operator is linear in
// each): for a cotangent g (M, E, n³) of w, with gq_m = J⊗J⊗J g_m on the rule,
//   cbar_m = Σ_a D_aᵀ (v_a ⊙ gq_m),                         D_r = J⊗J⊗Dd, …
//   ubar_d = Jᵀ⊗Jᵀ⊗Jᵀ [ Σ_a Brx[a][d] ⊙ Σ_m gq_m ⊙ (D_a c_m) ].
// v_a as in conv_kernel (registers); the rule's Σ_m sums (3 q³ words, each thread its own column)
// in shared memory. The einsum form: jax.vjp of jaxsem.operators.convection.advection_local.
template <int N>
__host__ __device__ constexpr int convt_words() {
  return conv_words<N>() + 3 * conv_q<N>() * conv_q<N>() * conv_q<N>();
}

template <int N>
__global__ void __launch_bounds__(conv_q<N>() * conv_q<N>() * elements_per_block<conv_q<N>()>())
convt_kernel(int64_t E, int M, const JAXSEM_REAL* __restrict__ g, const JAXSEM_REAL* __restrict__ c,
             const JAXSEM_REAL* __restrict__ u, const JAXSEM_REAL* __restrict__ Brx, JAXSEM_REAL* __restrict__ cbar,
             JAXSEM_REAL* __restrict__ ubar) {
  using T = JAXSEM_REAL;
  constexpr int Q = conv_q<N>(), EB = elements_per_block<Q>(), RN = odd_len(N);
  constexpr int n3 = N * N * N, q2 = Q * Q, q3 = Q * Q * Q;
  constexpr int OJ = ops_offset(N), OD = ops_offset(N) + Q * N;
  const int t = threadIdx.x + Q * threadIdx.y, z = threadIdx.z;
  T* U = reinterpret_cast<T*>(jaxsem_smem) + z * convt_words<N>();
  T* A = U + N * N * RN;
  T* S = A + lines_a_words<N, Q>();
  T* VB = S + lines_b_words<N, Q>();  // VB[a * q3 + k * q2 + t]: thread t's own column
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  const int64_t ee = active ? e : 0;
#pragma unroll
  for (int a = 0; a < 3; ++a)
#pragma unroll
    for (int k = 0; k < Q; ++k) VB[a * q3 + k * q2 + t] = 0;
  T v[3][Q];
  conv_carrier<N>(u, Brx, E, ee, active, t, U, A, S, v);
  for (int m = 0; m < M; ++m) {
    T gq[Q], x[Q], acc[N];
    conv_stage<N>(g + int64_t(m) * E * n3, ee, active, t, U);
    conv_forward<N, Q, OJ, OJ, OJ>(U, t, A, S, gq);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0;
#pragma unroll
    for (int k = 0; k < Q; ++k) x[k] = v[0][k] * gq[k];
    conv_back_add<N, Q, OD, OJ, OJ>(t, A, S, x, acc);
#pragma unroll
    for (int k = 0; k < Q; ++k) x[k] = v[1][k] * gq[k];
    conv_back_add<N, Q, OJ, OD, OJ>(t, A, S, x, acc);
#pragma unroll
    for (int k = 0; k < Q; ++k) x[k] = v[2][k] * gq[k];
    conv_back_add<N, Q, OJ, OJ, OD>(t, A, S, x, acc);
    if (active && t < N * N) {
      T* out = cbar + (int64_t(m) * E + ee) * n3 + t * N;
#pragma unroll
      for (int i = 0; i < N; ++i) out[i] = acc[i];
    }
    conv_stage<N>(c + int64_t(m) * E * n3, ee, active, t, U);  // U's last readers (phase 1 of gq's transform) are past two barriers
    conv_forward<N, Q, OD, OJ, OJ>(U, t, A, S, x);
#pragma unroll
    for (int k = 0; k < Q; ++k) VB[0 * q3 + k * q2 + t] += gq[k] * x[k];
    conv_forward<N, Q, OJ, OD, OJ>(U, t, A, S, x);
#pragma unroll
    for (int k = 0; k < Q; ++k) VB[1 * q3 + k * q2 + t] += gq[k] * x[k];
    conv_forward<N, Q, OJ, OJ, OD>(U, t, A, S, x);
#pragma unroll
    for (int k = 0; k < Q; ++k) VB[2 * q3 + k * q2 + t] += gq[k] * x[k];
  }
  for (int d = 0; d < 3; ++d) {
    T x[Q];
#pragma unroll
    for (int k = 0; k < Q; ++k) x[k] = 0;
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      const T* gp = Brx + ((a * 3 + d) * E + ee) * int64_t(q3) + t;
#pragma unroll
      for (int k = 0; k < Q; ++k) x[k] += (active ? gp[k * q2] : T(0)) * VB[a * q3 + k * q2 + t];
    }
    lines_back<N, Q>(ubar + (int64_t(d) * E + ee) * n3, active, t, A, S, x);
  }
}

template <int N, typename T>
bool launch_convt(cudaStream_t st, int variant, int64_t E, int M, const T* g, const T* c, const T* u, const T* J,
                  const T* Dd, const T* Brx, T* cbar, T* ubar) {
  constexpr int Q = conv_q<N>(), EB = elements_per_block<Q>();
  switch (variant) {
    case 2: {
      copy_ops(J, Q * N, ops_offset(N), st);
      copy_ops(Dd, Q * N, ops_offset(N) + Q * N, st);
      dim3 block(Q, Q, EB), grid(unsigned((E + EB - 1) / EB));
      const size_t smem = sizeof(T) * EB * convt_words<N>();
      auto kernel = convt_kernel<N>;
      allow_smem(kernel, smem);
      kernel<<<grid, block, smem, st>>>(E, M, g, c, u, Brx, cbar, ubar);
      return true;
    }
    default: return false;
  }
}
#endif

template <int N, typename T>
bool launch_conv(cudaStream_t st, int variant, int64_t E, int M, const T* c, const T* u, const T* J, const T* Dd,
                 const T* Brx, T* w) {
  constexpr int Q = conv_q<N>(), EB = elements_per_block<Q>();
  switch (variant) {
    case 2: {  // the one kernel: one element per Q × Q thread layer, transforms by lines
      copy_ops(J, Q * N, ops_offset(N), st);
      copy_ops(Dd, Q * N, ops_offset(N) + Q * N, st);
      dim3 block(Q, Q, EB), grid(unsigned((E + EB - 1) / EB));
      const size_t smem = sizeof(T) * EB * conv_words<N>();
      auto kernel = conv_kernel<N>;
      allow_smem(kernel, smem);
      kernel<<<grid, block, smem, st>>>(E, M, c, u, Brx, w);
      return true;
    }
    default: return false;
  }
}
#endif


// Each launch_* runs one variant of its operator at order N (cuda.VARIANTS lists them; the
// `case` labels below are the variants that exist) and returns false for any other number.
// MINB is __launch_bounds__' minimum of resident blocks (0: ptxas' own register choice), OPT the
// options of collocated_stage.
constexpr int OPT_ALL = OPT_CONST | OPT_ROWS | OPT_PREFETCH;

template <int N, typename T>
bool launch_bk5(const Launch<T>& L, int variant, const T* u, const T* D, const T* G, T* w) {
  constexpr int EB = elements_per_block<N>();
  dim3 block(N, N, EB), grid(unsigned((L.E + EB - 1) / EB));
  const bool aff = (variant & AFFINE) != 0;
  variant &= ~AFFINE;
  auto element = [&](auto minb, auto opt) {  // whole element per stage (bk5_element_kernel)
    if constexpr ((decltype(opt)::value & OPT_CONST) != 0) copy_ops(D, N * N, ops_offset(N), L.stream);
    const size_t smem = sizeof(T) * (2 * N * N + EB * 3 * N * N * N);
    auto go = [&](auto kernel) {
      allow_smem(kernel, smem);
      kernel<<<grid, block, smem, L.stream>>>(L.E, L.C, L.l2, u, D, G, w, nullptr, 0);
    };
    if (aff)
      go(bk5_element_kernel<N, T, decltype(minb)::value, decltype(opt)::value, false, true>);
    else
      go(bk5_element_kernel<N, T, decltype(minb)::value, decltype(opt)::value>);
  };
  if (aff && (variant == 1 || variant == 8 || variant == 10)) return false;  // element variants only
  auto lines = [&](auto minb) {  // collocated stage by lines (bk5_lines_kernel)
    copy_ops(D, N * N, ops_offset(N), L.stream);
    const size_t smem = sizeof(T) * EB * 4 * coll_words<N>();
    auto kernel = bk5_lines_kernel<N, decltype(minb)::value>;
    allow_smem(kernel, smem);
    kernel<<<grid, block, smem, L.stream>>>(L.E, L.C, L.l2, u, G, w);
  };
  switch (variant) {
    case 1:  // one k-slice per step (bk5_kernel; no L2 prefetch)
      bk5_kernel<N, T><<<grid, block, 0, L.stream>>>(L.E, L.C, u, D, G, w);
      return true;
    case 2: element(Int<0>{}, Int<0>{}); return true;
    case 4: element(Int<0>{}, Int<OPT_ALL>{}); return true;
    case 5: element(Int<2>{}, Int<OPT_ALL>{}); return true;
    case 6: element(Int<0>{}, Int<OPT_CONST>{}); return true;
    case 7: element(Int<2>{}, Int<OPT_CONST>{}); return true;
    case 8: lines(Int<0>{}); return true;
    case 10: lines(Int<2>{}); return true;
    default: return false;
  }
}

// BK5/BK6 in assembled storage (bk5_element_kernel with ASM): u, w (C, nf), idx (E, n³); w is
// zeroed here, then the element variants add into it.
template <int N, typename T>
bool launch_bk5a(const Launch<T>& L, int variant, int64_t nf, const T* u, const int32_t* idx,
                          const T* D, const T* G, T* w) {
  constexpr int EB = elements_per_block<N>();
  dim3 block(N, N, EB), grid(unsigned((L.E + EB - 1) / EB));
  if (cudaMemsetAsync(w, 0, sizeof(T) * size_t(L.C) * size_t(nf), L.stream) != cudaSuccess) return true;
  const bool aff = (variant & AFFINE) != 0;
  variant &= ~AFFINE;
  auto element = [&](auto minb, auto opt) {
    if constexpr ((decltype(opt)::value & OPT_CONST) != 0) copy_ops(D, N * N, ops_offset(N), L.stream);
    const size_t smem = sizeof(T) * (2 * N * N + EB * 3 * N * N * N);
    auto go = [&](auto kernel) {
      allow_smem(kernel, smem);
      kernel<<<grid, block, smem, L.stream>>>(L.E, L.C, L.l2, u, D, G, w, idx, nf);
    };
    if (aff)
      go(bk5_element_kernel<N, T, decltype(minb)::value, decltype(opt)::value, true, true>);
    else
      go(bk5_element_kernel<N, T, decltype(minb)::value, decltype(opt)::value, true>);
  };
  switch (variant) {
    case 2: element(Int<0>{}, Int<0>{}); return true;
    case 5: element(Int<2>{}, Int<OPT_ALL>{}); return true;
    case 6: element(Int<0>{}, Int<OPT_CONST>{}); return true;
    case 7: element(Int<2>{}, Int<OPT_CONST>{}); return true;
    default: return false;
  }
}

template <int N, typename T>
bool launch_mass(const Launch<T>& L, int variant, const T* u, const T* J, const T* B, T* w) {
  constexpr int Q = N + 1;
  constexpr int EB = elements_per_block<Q>();
  dim3 block(Q, Q, EB), grid(unsigned((L.E + EB - 1) / EB));
  auto lines = [&](auto minb) {  // interpolations by lines (mass_lines_kernel)
    copy_ops(J, Q * N, ops_offset(N), L.stream);
    const size_t smem = sizeof(T) * EB * (lines_a_words<N, Q>() + lines_b_words<N, Q>());
    auto kernel = mass_lines_kernel<N, Q, decltype(minb)::value>;
    allow_smem(kernel, smem);
    kernel<<<grid, block, smem, L.stream>>>(L.E, L.C, L.l2, u, B, w);
  };
  switch (variant) {
    case 8: lines(Int<0>{}); return true;
    case 9: lines(Int<3>{}); return true;   // registers capped for three blocks per multiprocessor
    case 10: lines(Int<4>{}); return true;  // four blocks
    default: return false;
  }
}

template <int N, typename T>
bool launch_stiffness(const Launch<T>& L, int variant, const T* u, const T* J, const T* Dq, const T* G, T* w) {
  constexpr int Q = N + 1;
  constexpr int EB = elements_per_block<Q>();
  dim3 block(Q, Q, EB), grid(unsigned((L.E + EB - 1) / EB));
  auto element = [&](auto minb) {  // whole element per stage (stiffness_element_kernel)
    const size_t smem = sizeof(T) * (Q * N + 2 * Q * Q + EB * stiffness_region<N, Q>());
    auto kernel = stiffness_element_kernel<N, Q, T, decltype(minb)::value>;
    allow_smem(kernel, smem);
    kernel<<<grid, block, smem, L.stream>>>(L.E, L.C, L.l2, u, J, Dq, G, w);
  };
  auto lines = [&](auto minb, auto opt) {  // interpolations by lines (stiffness_lines_kernel)
    copy_ops(J, Q * N, ops_offset(N), L.stream);
    copy_ops(Dq, Q * Q, ops_offset(N) + Q * N, L.stream);
    constexpr int words = lines_a_words<N, Q>() + lines_b_words<N, Q>();
    constexpr int region = 3 * Q * Q * Q > words ? 3 * Q * Q * Q : words;
    const size_t smem = sizeof(T) * (2 * Q * Q + EB * region);
    auto kernel = stiffness_lines_kernel<N, Q, decltype(minb)::value, decltype(opt)::value>;
    allow_smem(kernel, smem);
    kernel<<<grid, block, smem, L.stream>>>(L.E, L.C, L.l2, u, Dq, G, w, nullptr, 0);
  };
  switch (variant) {
    case 2: element(Int<0>{}); return true;
    case 3: element(Int<2>{}); return true;
    case 8: lines(Int<0>{}, Int<OPT_CONST>{}); return true;
    case 9: lines(Int<3>{}, Int<OPT_CONST>{}); return true;              // capped for three blocks
    case 11: lines(Int<2>{}, Int<OPT_CONST | OPT_ROWS>{}); return true;  // D rows in registers, two blocks
    default: return false;
  }
}

// BK3/BK4 in assembled storage (stiffness_lines_kernel with ASM): u, w (C, nf), idx (E, n³); w
// is zeroed here, then the variants by lines add into it.
template <int N, typename T>
bool launch_stiffnessa(const Launch<T>& L, int variant, int64_t nf, const T* u, const int32_t* idx, const T* J,
                       const T* Dq, const T* G, T* w) {
  constexpr int Q = N + 1;
  constexpr int EB = elements_per_block<Q>();
  dim3 block(Q, Q, EB), grid(unsigned((L.E + EB - 1) / EB));
  if (cudaMemsetAsync(w, 0, sizeof(T) * size_t(L.C) * size_t(nf), L.stream) != cudaSuccess) return true;
  auto lines = [&](auto minb, auto opt) {
    copy_ops(J, Q * N, ops_offset(N), L.stream);
    copy_ops(Dq, Q * Q, ops_offset(N) + Q * N, L.stream);
    constexpr int words = lines_a_words<N, Q>() + lines_b_words<N, Q>();
    constexpr int region = 3 * Q * Q * Q > words ? 3 * Q * Q * Q : words;
    const size_t smem = sizeof(T) * (2 * Q * Q + EB * region);
    auto kernel = stiffness_lines_kernel<N, Q, decltype(minb)::value, decltype(opt)::value, true>;
    allow_smem(kernel, smem);
    kernel<<<grid, block, smem, L.stream>>>(L.E, L.C, L.l2, u, Dq, G, w, idx, nf);
  };
  switch (variant) {
    case 8: lines(Int<0>{}, Int<OPT_CONST>{}); return true;
    case 9: lines(Int<3>{}, Int<OPT_CONST>{}); return true;
    case 11: lines(Int<2>{}, Int<OPT_CONST | OPT_ROWS>{}); return true;
    default: return false;
  }
}

#if !defined(JAXSEM_OP_GS)
#ifndef JAXSEM_N
#error "define JAXSEM_N (n = p + 1, 2..16): each element-kernel library holds one order"
#endif
static_assert(JAXSEM_N >= 2 && JAXSEM_N <= 16, "JAXSEM_N must be in 2..16");
#endif

// u, w: (C, E, n, n, n) — C and E from the shape, n its last dimension.
struct Shape {
  int64_t C, E;
  int n;
};

ffi::Error shape_of(const ffi::AnyBuffer& u, Shape& s) {
  auto d = u.dimensions();
  if (d.size() != 5) return ffi::Error::InvalidArgument("jaxsem cuda: u must be (C, E, n, n, n)");
  s.C = d[0];
  s.E = d[1];
  s.n = int(d[4]);
  return ffi::Error::Success();
}

ffi::Error finish(bool launched) {
  if (!launched) return ffi::Error::InvalidArgument("jaxsem cuda: this operator has no such variant");
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(err));
  return ffi::Error::Success();
}

#if defined(JAXSEM_N)
template <typename T>
ffi::Error bk5_typed(cudaStream_t st, int variant, const Shape& s, const ffi::AnyBuffer& u, const ffi::AnyBuffer& D,
                     const ffi::AnyBuffer& G, ffi::Result<ffi::AnyBuffer>& w) {
  Launch<T> L{st, s.E, int(s.C), (variant & PREFETCH_L2) != 0};
  variant &= ~PREFETCH_L2;
  auto pu = static_cast<const T*>(u.untyped_data());
  auto pD = static_cast<const T*>(D.untyped_data());
  auto pG = static_cast<const T*>(G.untyped_data());
  auto pw = static_cast<T*>(w->untyped_data());
  return finish(launch_bk5<JAXSEM_N, T>(L, variant, pu, pD, pG, pw));
}

template <typename T>
ffi::Error bk5_assembled_typed(cudaStream_t st, int variant, int64_t C, int64_t nf, int64_t E,
                               const ffi::AnyBuffer& u, const ffi::AnyBuffer& idx, const ffi::AnyBuffer& D,
                               const ffi::AnyBuffer& G, ffi::Result<ffi::AnyBuffer>& w) {
  Launch<T> L{st, E, int(C), (variant & PREFETCH_L2) != 0};
  variant &= ~PREFETCH_L2;
  auto pu = static_cast<const T*>(u.untyped_data());
  auto pi = static_cast<const int32_t*>(idx.untyped_data());
  auto pD = static_cast<const T*>(D.untyped_data());
  auto pG = static_cast<const T*>(G.untyped_data());
  auto pw = static_cast<T*>(w->untyped_data());
  return finish(launch_bk5a<JAXSEM_N, T>(L, variant, nf, pu, pi, pD, pG, pw));
}

template <typename T>
ffi::Error stiffness_assembled_typed(cudaStream_t st, int variant, int64_t C, int64_t nf, int64_t E,
                                     const ffi::AnyBuffer& u, const ffi::AnyBuffer& idx, const ffi::AnyBuffer& J,
                                     const ffi::AnyBuffer& Dq, const ffi::AnyBuffer& G, ffi::Result<ffi::AnyBuffer>& w) {
  Launch<T> L{st, E, int(C), (variant & PREFETCH_L2) != 0};
  variant &= ~PREFETCH_L2;
  auto pu = static_cast<const T*>(u.untyped_data());
  auto pi = static_cast<const int32_t*>(idx.untyped_data());
  auto pJ = static_cast<const T*>(J.untyped_data());
  auto pDq = static_cast<const T*>(Dq.untyped_data());
  auto pG = static_cast<const T*>(G.untyped_data());
  auto pw = static_cast<T*>(w->untyped_data());
  return finish(launch_stiffnessa<JAXSEM_N, T>(L, variant, nf, pu, pi, pJ, pDq, pG, pw));
}

template <typename T>
ffi::Error mass_typed(cudaStream_t st, int variant, const Shape& s, const ffi::AnyBuffer& u, const ffi::AnyBuffer& J,
                      const ffi::AnyBuffer& B, ffi::Result<ffi::AnyBuffer>& w) {
  Launch<T> L{st, s.E, int(s.C), (variant & PREFETCH_L2) != 0};
  variant &= ~PREFETCH_L2;
  auto pu = static_cast<const T*>(u.untyped_data());
  auto pJ = static_cast<const T*>(J.untyped_data());
  auto pB = static_cast<const T*>(B.untyped_data());
  auto pw = static_cast<T*>(w->untyped_data());
  return finish(launch_mass<JAXSEM_N, T>(L, variant, pu, pJ, pB, pw));
}

template <typename T>
ffi::Error stiffness_typed(cudaStream_t st, int variant, const Shape& s, const ffi::AnyBuffer& u,
                           const ffi::AnyBuffer& J, const ffi::AnyBuffer& Dq, const ffi::AnyBuffer& G,
                           ffi::Result<ffi::AnyBuffer>& w) {
  Launch<T> L{st, s.E, int(s.C), (variant & PREFETCH_L2) != 0};
  variant &= ~PREFETCH_L2;
  auto pu = static_cast<const T*>(u.untyped_data());
  auto pJ = static_cast<const T*>(J.untyped_data());
  auto pDq = static_cast<const T*>(Dq.untyped_data());
  auto pG = static_cast<const T*>(G.untyped_data());
  auto pw = static_cast<T*>(w->untyped_data());
  return finish(launch_stiffness<JAXSEM_N, T>(L, variant, pu, pJ, pDq, pG, pw));
}
#endif

constexpr ffi::DataType real_type() {
  return sizeof(JAXSEM_REAL) == 8 ? ffi::DataType::F64 : ffi::DataType::F32;
}

ffi::Error check(const ffi::AnyBuffer& u, Shape& s) {
  if (auto err = shape_of(u, s); err.failure()) return err;
  if (u.element_type() != real_type())
    return ffi::Error::InvalidArgument("jaxsem cuda: this library was built for another dtype");
#if defined(JAXSEM_N)
  if (s.n != JAXSEM_N) return ffi::Error::InvalidArgument("jaxsem cuda: this library was built for another n");
#endif
  return ffi::Error::Success();
}

#if defined(JAXSEM_N)
// Assembled storage (bk5a, stiffnessa): u, w (C, nf) vectors of global nodes; idx (E, n, n, n)
// int32, the global node of each local node (outside [0, nf): a Dirichlet node).
struct AsmShape {
  int64_t C, nf, E;
};

ffi::Error check_assembled(const ffi::AnyBuffer& u, const ffi::AnyBuffer& idx, AsmShape& s) {
  auto d = u.dimensions();
  auto di = idx.dimensions();
  if (d.size() != 2) return ffi::Error::InvalidArgument("jaxsem assembled kernel: u must be (C, nf)");
  if (u.element_type() != real_type())
    return ffi::Error::InvalidArgument("jaxsem assembled kernel: this library was built for another dtype");
  if (idx.element_type() != ffi::DataType::S32 || di.size() != 4 || di[3] != JAXSEM_N)
    return ffi::Error::InvalidArgument("jaxsem assembled kernel: idx must be (E, n, n, n) int32 with this library's n");
  s = AsmShape{d[0], d[1], di[0]};
  return ffi::Error::Success();
}
#endif

#if defined(JAXSEM_OP_BK5)
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer u, ffi::AnyBuffer D, ffi::AnyBuffer G,
                       ffi::Result<ffi::AnyBuffer> w) {
  Shape s;
  if (auto err = check(u, s); err.failure()) return err;
  if (s.E == 0 || s.C == 0) return ffi::Error::Success();
  return bk5_typed<JAXSEM_REAL>(st, variant, s, u, D, G, w);
}
#define JAXSEM_ARGS .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_BK5A)
// u, w: (C, nf); idx: (E, n, n, n) (check_assembled).
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer u, ffi::AnyBuffer idx, ffi::AnyBuffer D,
                       ffi::AnyBuffer G, ffi::Result<ffi::AnyBuffer> w) {
  AsmShape s;
  if (auto err = check_assembled(u, idx, s); err.failure()) return err;
  if (s.C == 0 || s.nf == 0) return ffi::Error::Success();
  return bk5_assembled_typed<JAXSEM_REAL>(st, variant, s.C, s.nf, s.E, u, idx, D, G, w);
}
#define JAXSEM_ARGS .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_STIFFNESSA)
// u, w: (C, nf); idx: (E, n, n, n) (check_assembled); J, Dq: (n + 1, n), (n + 1, n + 1); G: (6, E, q, q, q).
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer u, ffi::AnyBuffer idx, ffi::AnyBuffer J,
                       ffi::AnyBuffer Dq, ffi::AnyBuffer G, ffi::Result<ffi::AnyBuffer> w) {
  AsmShape s;
  if (auto err = check_assembled(u, idx, s); err.failure()) return err;
  if (s.C == 0 || s.nf == 0) return ffi::Error::Success();
  return stiffness_assembled_typed<JAXSEM_REAL>(st, variant, s.C, s.nf, s.E, u, idx, J, Dq, G, w);
}
#define JAXSEM_ARGS \
  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_MAXWELL) || defined(JAXSEM_OP_MAXWELLM)
// The Maxwell libraries' shared checks and arguments: q (6, E, n³) and nbr (E, 6, n²) int32; the
// other arrays in MaxwellArgs' order.
ffi::Error maxwell_args(const char* name, ffi::AnyBuffer q, ffi::AnyBuffer D, ffi::AnyBuffer rx,
                        ffi::AnyBuffer eps, ffi::AnyBuffer mu, ffi::AnyBuffer normal, ffi::AnyBuffer cE,
                        ffi::AnyBuffer aE, ffi::AnyBuffer cH, ffi::AnyBuffer aH, ffi::AnyBuffer nbr,
                        int32_t upwind, int32_t pmc, MaxwellArgs& A) {
  Shape s;
  if (auto err = check(q, s); err.failure()) return err;
  if (s.C != 6) return ffi::Error::InvalidArgument(std::string("jaxsem ") + name + ": q must be (6, E, n, n, n)");
  if (nbr.element_type() != ffi::DataType::S32 || nbr.element_count() != size_t(s.E * 6 * s.n * s.n))
    return ffi::Error::InvalidArgument(std::string("jaxsem ") + name + ": nbr must be (E, 6, n, n) int32");
  using T = JAXSEM_REAL;
  auto P = [](const ffi::AnyBuffer& b) { return static_cast<const T*>(b.untyped_data()); };
  A = MaxwellArgs{P(q), P(D), P(rx), P(eps), P(mu), P(normal), P(cE), P(aE), P(cH), P(aH),
                  static_cast<const int32_t*>(nbr.untyped_data()), nullptr, s.E, upwind != 0, pmc != 0};
  return ffi::Error::Success();
}
#if defined(JAXSEM_OP_MAXWELL)
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, int32_t upwind, int32_t pmc, ffi::AnyBuffer q,
                       ffi::AnyBuffer D, ffi::AnyBuffer rx, ffi::AnyBuffer eps, ffi::AnyBuffer mu,
                       ffi::AnyBuffer normal, ffi::AnyBuffer cE, ffi::AnyBuffer aE, ffi::AnyBuffer cH,
                       ffi::AnyBuffer aH, ffi::AnyBuffer nbr, ffi::Result<ffi::AnyBuffer> w) {
  MaxwellArgs A;
  if (auto err = maxwell_args("maxwell", q, D, rx, eps, mu, normal, cE, aE, cH, aH, nbr, upwind, pmc, A);
      err.failure())
    return err;
  if (A.E == 0) return ffi::Error::Success();
  A.w = static_cast<JAXSEM_REAL*>(w->untyped_data());
  return finish(launch_maxwell<JAXSEM_N, JAXSEM_REAL>(st, variant & ~PREFETCH_L2, A));
}
#define JAXSEM_ARGS                                                                                     \
  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>() \
      .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()            \
      .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#else  // JAXSEM_OP_MAXWELLM
// The material adjoint (MaxwellMatArgs): q and the coefficients as for JAXSEM_OP_MAXWELL, lam (6, E, n³);
// results gnode (2, E, n³) and gface (4, E, 6, n²).
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, int32_t upwind, int32_t pmc, ffi::AnyBuffer q,
                       ffi::AnyBuffer lam, ffi::AnyBuffer D, ffi::AnyBuffer rx, ffi::AnyBuffer eps,
                       ffi::AnyBuffer mu, ffi::AnyBuffer normal, ffi::AnyBuffer cE, ffi::AnyBuffer aE,
                       ffi::AnyBuffer cH, ffi::AnyBuffer aH, ffi::AnyBuffer nbr, ffi::Result<ffi::AnyBuffer> gnode,
                       ffi::Result<ffi::AnyBuffer> gface) {
  MaxwellArgs A;
  if (auto err = maxwell_args("maxwell material adjoint", q, D, rx, eps, mu, normal, cE, aE, cH, aH, nbr, upwind,
                              pmc, A);
      err.failure())
    return err;
  if (lam.element_count() != q.element_count() || lam.element_type() != q.element_type())
    return ffi::Error::InvalidArgument("jaxsem maxwell material adjoint: lam must be shaped as q");
  if (A.E == 0) return ffi::Error::Success();
  using T = JAXSEM_REAL;
  MaxwellMatArgs M{static_cast<const T*>(lam.untyped_data()), static_cast<T*>(gnode->untyped_data()),
                   static_cast<T*>(gface->untyped_data())};
  return finish(launch_maxwell<JAXSEM_N, T, true>(st, variant & ~PREFETCH_L2, A, M));
}
#define JAXSEM_ARGS                                                                                     \
  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>() \
      .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()            \
      .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#define JAXSEM_RETS .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
#endif
#define JAXSEM_ATTRS .Attr<int32_t>("upwind").Attr<int32_t>("pmc")
#elif defined(JAXSEM_OP_ADVECTION)
// u, w: (1, E, n, n, n); form: ADV_SPLIT, ADV_CONSERVATIVE or ADV_CHAIN.
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, int32_t upwind, int32_t form, ffi::AnyBuffer u,
                       ffi::AnyBuffer D, ffi::AnyBuffer A, ffi::AnyBuffer jac, ffi::AnyBuffer an,
                       ffi::AnyBuffer vn, ffi::AnyBuffer lw, ffi::AnyBuffer nbr, ffi::Result<ffi::AnyBuffer> w) {
  Shape s;
  if (auto err = check(u, s); err.failure()) return err;
  if (s.C != 1) return ffi::Error::InvalidArgument("jaxsem advection: u must be (1, E, n, n, n)");
  if (nbr.element_type() != ffi::DataType::S32 || nbr.element_count() != size_t(s.E * 6 * s.n * s.n))
    return ffi::Error::InvalidArgument("jaxsem advection: nbr must be (E, 6, n, n) int32");
  if (s.E == 0) return ffi::Error::Success();
  using T = JAXSEM_REAL;
  auto P = [](const ffi::AnyBuffer& b) { return static_cast<const T*>(b.untyped_data()); };
  AdvectionArgs args{P(u), P(D), P(A), P(jac), P(an), P(vn), P(lw), static_cast<const int32_t*>(nbr.untyped_data()),
                     static_cast<T*>(w->untyped_data()), s.E, upwind != 0};
  return finish(launch_advection<JAXSEM_N, T>(st, variant & ~PREFETCH_L2, form, args));
}
#define JAXSEM_ATTRS .Attr<int32_t>("upwind").Attr<int32_t>("form")
#define JAXSEM_ARGS                                                                                     \
  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>() \
      .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_CONV)
// c, w: (M, E, n, n, n) the carried fields; u: (3, E, n, n, n) the carrier; J, Dd: (q, n) with
// q = ceil(3n/2); Brx: (3, 3, E, q, q, q).
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer c, ffi::AnyBuffer u, ffi::AnyBuffer J,
                       ffi::AnyBuffer Dd, ffi::AnyBuffer Brx, ffi::Result<ffi::AnyBuffer> w) {
  Shape s;
  if (auto err = check(c, s); err.failure()) return err;
  constexpr int64_t Q = conv_q<JAXSEM_N>();
  const int64_t n3 = int64_t(s.n) * s.n * s.n;
  if (u.element_type() != c.element_type() || u.element_count() != size_t(3 * s.E * n3))
    return ffi::Error::InvalidArgument("jaxsem conv: u must be (3, E, n, n, n) like c");
  if (J.element_count() != size_t(Q * s.n) || Dd.element_count() != size_t(Q * s.n))
    return ffi::Error::InvalidArgument("jaxsem conv: J and Dd must be (ceil(3n/2), n)");
  if (Brx.element_count() != size_t(9 * s.E * Q * Q * Q))
    return ffi::Error::InvalidArgument("jaxsem conv: Brx must be (3, 3, E, q, q, q)");
  if (s.E == 0 || s.C == 0) return ffi::Error::Success();
  using T = JAXSEM_REAL;
  auto P = [](const ffi::AnyBuffer& b) { return static_cast<const T*>(b.untyped_data()); };
  return finish(launch_conv<JAXSEM_N, T>(st, variant & ~PREFETCH_L2, s.E, int(s.C), P(c), P(u), P(J), P(Dd), P(Brx),
                                         static_cast<T*>(w->untyped_data())));
}
#define JAXSEM_ARGS .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_CONVT)
// The transpose of conv's linearization in (c, u): g, c, cbar: (M, E, n, n, n); u, ubar: (3, E, n, n, n);
// J, Dd, Brx as for conv.
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer g, ffi::AnyBuffer c, ffi::AnyBuffer u,
                       ffi::AnyBuffer J, ffi::AnyBuffer Dd, ffi::AnyBuffer Brx, ffi::Result<ffi::AnyBuffer> cbar,
                       ffi::Result<ffi::AnyBuffer> ubar) {
  Shape s;
  if (auto err = check(g, s); err.failure()) return err;
  constexpr int64_t Q = conv_q<JAXSEM_N>();
  const int64_t n3 = int64_t(s.n) * s.n * s.n;
  if (c.element_type() != g.element_type() || c.element_count() != g.element_count())
    return ffi::Error::InvalidArgument("jaxsem convt: c must be shaped like g");
  if (u.element_type() != g.element_type() || u.element_count() != size_t(3 * s.E * n3))
    return ffi::Error::InvalidArgument("jaxsem convt: u must be (3, E, n, n, n) like g");
  if (J.element_count() != size_t(Q * s.n) || Dd.element_count() != size_t(Q * s.n))
    return ffi::Error::InvalidArgument("jaxsem convt: J and Dd must be (ceil(3n/2), n)");
  if (Brx.element_count() != size_t(9 * s.E * Q * Q * Q))
    return ffi::Error::InvalidArgument("jaxsem convt: Brx must be (3, 3, E, q, q, q)");
  if (s.E == 0) return ffi::Error::Success();
  using T = JAXSEM_REAL;
  auto P = [](const ffi::AnyBuffer& b) { return static_cast<const T*>(b.untyped_data()); };
  return finish(launch_convt<JAXSEM_N, T>(st, variant & ~PREFETCH_L2, s.E, int(s.C), P(g), P(c), P(u), P(J), P(Dd),
                                          P(Brx), static_cast<T*>(cbar->untyped_data()),
                                          static_cast<T*>(ubar->untyped_data())));
}
#define JAXSEM_ARGS                                                                                     \
  .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>() \
      .Arg<ffi::AnyBuffer>()
#define JAXSEM_RETS .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_MASS)
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer u, ffi::AnyBuffer J, ffi::AnyBuffer B,
                       ffi::Result<ffi::AnyBuffer> w) {
  Shape s;
  if (auto err = check(u, s); err.failure()) return err;
  if (s.E == 0 || s.C == 0) return ffi::Error::Success();
  return mass_typed<JAXSEM_REAL>(st, variant, s, u, J, B, w);
}
#define JAXSEM_ARGS .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_STIFFNESS)
ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer u, ffi::AnyBuffer J, ffi::AnyBuffer Dq,
                       ffi::AnyBuffer G, ffi::Result<ffi::AnyBuffer> w) {
  Shape s;
  if (auto err = check(u, s); err.failure()) return err;
  if (s.E == 0 || s.C == 0) return ffi::Error::Success();
  return stiffness_typed<JAXSEM_REAL>(st, variant, s, u, J, Dq, G, w);
}
#define JAXSEM_ARGS .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_INTERP)
// p-multigrid transfers between two orders (jaxsem.solvers.multigrid), J (n, m) the GLL-to-GLL
// interpolation from m to n = JAXSEM_N points (m < n, from the shapes):
//   variant 0, prolongation:              w = J⊗J⊗J u,    u (C, E, m³) → w (C, E, n³)
//   variant 1, restriction's transpose:   w = Jᵀ⊗Jᵀ⊗Jᵀ v, v (C, E, n³) → w (C, E, m³)
// One element per n×n thread layer (the mass kernel's forward_element / back_element with
// N = m, Q = n): the element goes through shared memory once, J sits in shared memory, every
// value is read and written once, coalesced. The einsum form is jaxsem.operators.tensor.interp.
template <int N, int Q, typename T, bool BACK>
__global__ void __launch_bounds__(Q * Q * elements_per_block<Q>())
interp_kernel(int64_t E, int C, const T* __restrict__ u, const T* __restrict__ J, T* __restrict__ w) {
  constexpr int EB = elements_per_block<Q>();
  constexpr int64_t n3 = N * N * N, q3 = Q * Q * Q;
  T* sJ = reinterpret_cast<T*>(jaxsem_smem);  // sJ[c*N + k] = J[c][k]
  const int a = threadIdx.x, b = threadIdx.y, z = threadIdx.z;
  T* A = sJ + Q * N + z * mass_region<N, Q>();
  T* Bf = A + N * N * Q;
  const int tid = a + Q * (b + Q * z);
  for (int t = tid; t < Q * N; t += Q * Q * EB) sJ[t] = J[t];
  __syncthreads();
  const int64_t e = int64_t(blockIdx.x) * EB + z;
  const bool active = e < E;
  const int64_t ee = active ? e : 0;
  for (int c = 0; c < C; ++c) {
    if constexpr (BACK) {
      T rv[Q];
      const T* ve = u + (c * E + ee) * q3 + b * Q + a;
#pragma unroll
      for (int k = 0; k < Q; ++k) rv[k] = active ? ve[k * Q * Q] : T(0);
      back_element<N, Q, T>(w + (c * E + ee) * n3, active, a, b, sJ, static_cast<const T*>(sJ), A, Bf, rv);
    } else {
      T rx[Q];
      forward_element<N, Q, T>(u + (c * E + ee) * n3, active, a, b, sJ, static_cast<const T*>(sJ), A, Bf, rx);
      if (active) {
        T* we = w + (c * E + ee) * q3 + b * Q + a;
#pragma unroll
        for (int k = 0; k < Q; ++k) we[k * Q * Q] = rx[k];
      }
    }
  }
}

template <int N, int Q, typename T, bool BACK>
void launch_interp_mn(cudaStream_t st, int64_t E, int C, const T* u, const T* J, T* w) {
  constexpr int EB = elements_per_block<Q>();
  const size_t smem = sizeof(T) * (Q * N + EB * mass_region<N, Q>());
  auto kernel = interp_kernel<N, Q, T, BACK>;
  allow_smem(kernel, smem);
  const int64_t blocks = (E + EB - 1) / EB;
  kernel<<<dim3(unsigned(blocks)), dim3(Q, Q, EB), smem, st>>>(E, C, u, J, w);
}

// the coarse size m at run time: one instance per m = 2 … n − 1
template <int Q, typename T, bool BACK, int N = 2>
bool launch_interp(int m, cudaStream_t st, int64_t E, int C, const T* u, const T* J, T* w) {
  if constexpr (N >= Q) {
    return false;
  } else {
    if (m == N) {
      launch_interp_mn<N, Q, T, BACK>(st, E, C, u, J, w);
      return true;
    }
    return launch_interp<Q, T, BACK, N + 1>(m, st, E, C, u, J, w);
  }
}

ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer u, ffi::AnyBuffer J,
                       ffi::Result<ffi::AnyBuffer> w) {
  using T = JAXSEM_REAL;
  auto d = u.dimensions();
  auto dj = J.dimensions();
  if (u.element_type() != real_type() || J.element_type() != real_type())
    return ffi::Error::InvalidArgument("jaxsem interp: this library was built for another dtype");
  if (d.size() != 5 || dj.size() != 2 || dj[0] != JAXSEM_N || !(variant == 0 || variant == 1))
    return ffi::Error::InvalidArgument("jaxsem interp: u must be (C, E, a, a, a), J (n, m) with this library's n");
  const int m = int(dj[1]);
  const int64_t in = variant == 0 ? m : JAXSEM_N;
  if (m < 2 || m >= JAXSEM_N || d[2] != in || d[3] != in || d[4] != in)
    return ffi::Error::InvalidArgument("jaxsem interp: u's element size must be J's m (prolongation) or n");
  const int64_t C = d[0], E = d[1];
  if (C == 0 || E == 0) return ffi::Error::Success();
  auto pu = static_cast<const T*>(u.untyped_data());
  auto pJ = static_cast<const T*>(J.untyped_data());
  auto pw = static_cast<T*>(w->untyped_data());
  const bool ok = variant == 0 ? launch_interp<JAXSEM_N, T, false>(m, st, E, int(C), pu, pJ, pw)
                               : launch_interp<JAXSEM_N, T, true>(m, st, E, int(C), pu, pJ, pw);
  return finish(ok);
}
#define JAXSEM_ARGS .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#elif defined(JAXSEM_OP_GS)
// Gather–scatter QQᵀ as a gather only (gather_scatter.py, layout "csr"): local node i of a
// (C, L) E-vector gets the sum of its node's copies, idx[off[i]:off[i+1]] (every copy, itself
// included, in one canonical order so all copies get bit-identical sums); off[i] = off[i+1]
// marks a node with one copy, which keeps its value. No scatter, atomics or global array.
// CC components (1 or 3) per launch, their loads issued together before the row's bounds are
// known; the host launches it once per group of components.
template <typename T, int CC>
__global__ void gs_csr_kernel(int64_t L, const T* __restrict__ u, const int32_t* __restrict__ off,
                              const int32_t* __restrict__ idx, T* __restrict__ w) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L; i += int64_t(gridDim.x) * blockDim.x) {
    T own[CC];
#pragma unroll
    for (int c = 0; c < CC; ++c) own[c] = u[c * L + i];
    const int32_t b = off[i], e = off[i + 1];
    if (b != e) {
#pragma unroll
      for (int c = 0; c < CC; ++c) own[c] = 0;
      for (int32_t j = b; j < e; ++j) {
        const int64_t k = idx[j];
#pragma unroll
        for (int c = 0; c < CC; ++c) own[c] += u[c * L + k];
      }
    }
#pragma unroll
    for (int c = 0; c < CC; ++c) w[c * L + i] = own[c];
  }
}

ffi::Error kernel_impl(cudaStream_t st, int32_t variant, ffi::AnyBuffer u, ffi::AnyBuffer off, ffi::AnyBuffer idx,
                       ffi::Result<ffi::AnyBuffer> w) {
  auto d = u.dimensions();
  if (d.size() != 2) return ffi::Error::InvalidArgument("jaxsem gs: u must be (C, L)");
  if (u.element_type() != real_type())
    return ffi::Error::InvalidArgument("jaxsem gs: this library was built for another dtype");
  if (off.element_type() != ffi::DataType::S32 || idx.element_type() != ffi::DataType::S32)
    return ffi::Error::InvalidArgument("jaxsem gs: off and idx must be int32");
  const int64_t C = d[0], L = d[1];
  if (off.element_count() != size_t(L + 1)) return ffi::Error::InvalidArgument("jaxsem gs: off must be (L + 1,)");
  if (L == 0 || C == 0) return ffi::Error::Success();
  const int threads = 256;
  const int64_t blocks = (L + threads - 1) / threads;
  const unsigned grid = unsigned(blocks < 65535 * 32 ? blocks : 65535 * 32);
  auto pu = static_cast<const JAXSEM_REAL*>(u.untyped_data());
  auto po = static_cast<const int32_t*>(off.untyped_data());
  auto pi = static_cast<const int32_t*>(idx.untyped_data());
  auto pw = static_cast<JAXSEM_REAL*>(w->untyped_data());
  for (int64_t c = 0; c < C;) {  // three components per launch, then one at a time
    if (C - c >= 3) {
      gs_csr_kernel<JAXSEM_REAL, 3><<<grid, threads, 0, st>>>(L, pu + c * L, po, pi, pw + c * L);
      c += 3;
    } else {
      gs_csr_kernel<JAXSEM_REAL, 1><<<grid, threads, 0, st>>>(L, pu + c * L, po, pi, pw + c * L);
      c += 1;
    }
  }
  return finish(true);
}
#define JAXSEM_ARGS .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
#else
#error "define one of JAXSEM_OP_BK5, _BK5A, _MAXWELL, _MAXWELLM, _ADVECTION, _CONV, _CONVT, _MASS, _STIFFNESS, _STIFFNESSA, _INTERP, _GS"
#endif

}  // namespace

#ifndef JAXSEM_ATTRS
#define JAXSEM_ATTRS
#endif
#ifndef JAXSEM_RETS
#define JAXSEM_RETS .Ret<ffi::AnyBuffer>()
#endif

// One handler per library: jaxsem/backends/cuda.py compiles this file once per operator, dtype
// and (element kernels) order: -DJAXSEM_OP_BK5|BK5A|MAXWELL|MAXWELLM|ADVECTION|CONV|CONVT|MASS|STIFFNESS|STIFFNESSA|INTERP|GS
// -DJAXSEM_REAL=double|float -DJAXSEM_N=n.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsemKernel, kernel_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Attr<int32_t>("variant") JAXSEM_ATTRS JAXSEM_ARGS JAXSEM_RETS,
                              // kernel launches only: XLA may record it in a CUDA graph
                              // (the PCG loop body stays one command buffer)
                              {ffi::Traits::kCmdBufferCompatible});


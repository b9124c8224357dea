// Single-pass top-k + log-sum-exp over logits rows (fp32/bf16/fp16).
//
// A row is split into `splits` chunks only when there are too few rows to keep the resident
// blocks busy. A block reads its chunk once, 4 x 16 bytes per thread per step, loading the next
// step while it works on this one; a short scalar head brings unaligned rows to 16 bytes. Per
// step each thread takes the max of its elements, rescales its online log-sum-exp at most once
// and adds exp2 of the pre-scaled values. Selection is threshold-based: an element can be in the
// top k only if it is at or above a key that the block provably holds k distinct elements at or
// above. That bound is raised on every hit from the block's per-thread running maxima (see
// WarpTop), from each warp's exact k-th best and from a block-shared atomicMax of both. The rare
// elements that pass go, by shared-memory atomics, into a per-warp shared buffer; when a few dozen
// have piled up the warp selects its k best with warp-wide max reductions. Warps merge through
// shared memory; with several splits a one-warp-per-row kernel merges the partial lists and sums.
// Order: larger logit first, ties to the smaller token id, compared exactly on
// (order-preserving key, id), so the result equals a stable sort.
#include "common.cuh"
#include "ops.h"

namespace ddtree {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSplits = 32;
constexpr int kMaxK = 16;
constexpr int kBuf = 320;  // per-warp candidates: the k best so far + up to 47 + one step's 256
constexpr unsigned kPadKey = 0u;  // below every real key (the key of a NaN bit pattern)
constexpr int kPadId = INT_MAX;
constexpr unsigned kNegInfKey = 0x007fffffu;  // key(-inf)

// Order-preserving map float -> uint32 (larger float, larger key); -0 maps to +0's key so that
// the two tie as they do in a float compare.
__device__ __forceinline__ unsigned to_key(float x) {
  const unsigned u = __float_as_uint(x);
  const unsigned k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return k == 0x7fffffffu ? 0x80000000u : k;
}

__device__ __forceinline__ float from_key(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ bool kbetter(unsigned a, int ai, unsigned b, int bi) {
  return a > b || (a == b && ai < bi);
}

__device__ __forceinline__ unsigned warp_max_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, v);
#else
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
#endif
}

__device__ __forceinline__ unsigned warp_min_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_min_sync(kFullMask, v);
#else
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
#endif
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct Selected {
  unsigned key;  // lane r < k: the r-th best entry
  int id;
  unsigned kth_key;  // every lane: the k-th best (pad if fewer than k entries)
  int kth_id;
};

// Warp-wide: the k best of n (key, id) entries (n <= 32 * SLOTS; all lanes call it with the same
// n and k). Lane r < k gets the r-th best. Missing entries come back as pads.
template <int SLOTS>
__device__ __forceinline__ Selected warp_select(const unsigned* keys, const int* ids, int n, int k,
                                                int lane) {
  unsigned key[SLOTS];
  int id[SLOTS];
  unsigned bk = kPadKey;
  int bi = kPadId;
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    key[s] = kPadKey;
    id[s] = kPadId;
    if (s * 32 < n) {
      const int idx = s * 32 + lane;
      if (idx < n) {
        key[s] = keys[idx];
        id[s] = ids[idx];
      }
      if (kbetter(key[s], id[s], bk, bi)) { bk = key[s]; bi = id[s]; }
    }
  }
  Selected out{kPadKey, kPadId, kPadKey, kPadId};
  for (int r = 0; r < k; ++r) {
    const unsigned wk = warp_max_u32(bk);
    const int wi = static_cast<int>(warp_min_u32(bk == wk ? static_cast<unsigned>(bi) : 0xffffffffu));
    if (lane == r) { out.key = wk; out.id = wi; }
    out.kth_key = wk;
    out.kth_id = wi;
    if (bk == wk && bi == wi) {  // this lane held the winner: drop it, find its next best
      unsigned nk = kPadKey;
      int ni = kPadId;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (s * 32 < n) {
          if (key[s] == wk && id[s] == wi) { key[s] = kPadKey; id[s] = kPadId; }
          if (kbetter(key[s], id[s], nk, ni)) { nk = key[s]; ni = id[s]; }
        }
      }
      bk = nk;
      bi = ni;
    }
  }
  return out;
}

// Reduce a warp buffer of n candidates to its k best, stored at its front, sorted. Rare.
__device__ __noinline__ Selected flush_buffer(unsigned* keys, int* ids, int* count, int n, int k,
                                             int lane) {
  __syncwarp();
  const Selected sel = warp_select<kBuf / 32>(keys, ids, n, k, lane);
  __syncwarp();
  if (lane < k) {
    keys[lane] = sel.key;
    ids[lane] = sel.id;
  }
  if (lane == 0) *count = k;
  __syncwarp();
  return sel;
}

// Online log-sum-exp state: sum of exp(x - m) over the elements seen.
struct Lse {
  float m = -INFINITY;
  float s = 0.f;

  __device__ __forceinline__ void merge(float om, float os) {
    const float nm = fmaxf(m, om);
    if (nm == -INFINITY) return;
    s = s * exp2f((m - nm) * kLog2e) + os * exp2f((om - nm) * kLog2e);
    m = nm;
  }

  __device__ __forceinline__ void warp_reduce() {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      merge(__shfl_xor_sync(kFullMask, m, off), __shfl_xor_sync(kFullMask, s, off));
    }
  }
};

// One thread's running log-sum-exp: m is the largest element it has seen (a real element, or
// -inf before any), the sums are of exp(x - m), in two chains.
struct RunLse {
  float m = -INFINITY;
  float s0 = 0.f;
  float s1 = 0.f;
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Element j of a 16-byte vector, decoded exactly to fp32.
template <InKind K>
__device__ __forceinline__ float elem_of(const uint4& v, int j) {
  if constexpr (K == InKind::F32) {
    return __uint_as_float(word_of(v, j));
  } else if constexpr (K == InKind::BF16) {
    const uint32_t w = word_of(v, j >> 1);
    return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
  } else {
    const uint32_t w = word_of(v, j >> 1);
    return decode<K>(static_cast<uint16_t>((j & 1) ? (w >> 16) : (w & 0xffffu)));
  }
}

// Packed max of two 16-bit pairs (NaN loses to a number, as fmaxf). Exact for bf16 and fp16.
template <InKind K>
__device__ __forceinline__ uint32_t max_pair(uint32_t a, uint32_t b) {
  uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (K == InKind::BF16) {
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
#else
  const float lo = fmaxf(decode<K>(static_cast<uint16_t>(a & 0xffffu)),
                         decode<K>(static_cast<uint16_t>(b & 0xffffu)));
  const float hi = fmaxf(decode<K>(static_cast<uint16_t>(a >> 16)),
                         decode<K>(static_cast<uint16_t>(b >> 16)));
  // Pick the raw halves back (the max is one of the inputs, or NaN).
  const uint32_t alo = a & 0xffffu, blo = b & 0xffffu, ahi = a >> 16, bhi = b >> 16;
  d = (lo == decode<K>(static_cast<uint16_t>(alo)) ? alo : blo) |
      ((hi == decode<K>(static_cast<uint16_t>(ahi)) ? ahi : bhi) << 16);
#endif
  return d;
}

// The largest element of a 16-byte vector (NaNs ignored unless all are NaN).
template <InKind K>
__device__ __forceinline__ float vec_max(const uint4& v) {
  if constexpr (K == InKind::F32) {
    return fmaxf(fmaxf(__uint_as_float(v.x), __uint_as_float(v.y)),
                 fmaxf(__uint_as_float(v.z), __uint_as_float(v.w)));
  } else {
    const uint32_t w = max_pair<K>(max_pair<K>(v.x, v.y), max_pair<K>(v.z, v.w));
    return fmaxf(decode<K>(static_cast<uint16_t>(w & 0xffffu)),
                 decode<K>(static_cast<uint16_t>(w >> 16)));
  }
}

// A vector of four -inf elements of type K (the fill for lanes past the end).
template <InKind K>
__device__ __forceinline__ uint4 neg_inf_vec() {
  uint32_t w;
  if constexpr (K == InKind::F32) {
    w = 0xff800000u;
  } else if constexpr (K == InKind::BF16) {
    w = 0xff80ff80u;
  } else {
    w = 0xfc00fc00u;
  }
  return make_uint4(w, w, w, w);
}

// One warp's selection state. All methods are called by the whole warp, in warp-uniform control.
//
// Bound: thr_key is a key that the block provably holds k distinct elements at or above, so any
// element below it is out. It is the largest of
//   - this warp's k-th best buffered entry (after a flush),
//   - the block-shared value (`block_thr`, atomicMax of every warp's bounds),
//   - the k-th largest of 32 group maxima of the block's per-thread running maxima (group g is
//     threads g, g+32, ..., g+224; each thread's running max is one of its own elements, so
//     k groups at or above a value are k distinct elements), recomputed on every hit.
struct WarpTop {
  unsigned* keys;  // this warp's buffer in shared memory
  int* ids;
  unsigned* block_thr;  // shared: a key that the block holds k entries at or above
  int* shared_count;  // shared: entries in the buffer
  float* lmax;  // shared: each thread's running max (kThreads floats)
  int count;  // warp-uniform copy of *shared_count
  int k;
  int lane;
  int flush_at;
  unsigned own_key;  // this warp's k-th best at its last flush (pad until it has k)
  int own_id;
  unsigned thr_key;
  float thr;  // from_key(max(thr_key, key(-inf))), for the one-compare test

  __device__ __forceinline__ void raise(unsigned key) {
    thr_key = max(thr_key, key);
    thr = from_key(max(thr_key, kNegInfKey));
  }

  __device__ __forceinline__ void flush() {
    const Selected sel = flush_buffer(keys, ids, shared_count, count, k, lane);
    count = k;
    own_key = sel.kth_key;
    own_id = sel.kth_id;
    if (own_id != kPadId) {
      if (lane == 0) atomicMax(block_thr, own_key);
      raise(own_key);
    }
  }

  // One step over this thread's NV vectors of VEC elements: get(u, j) is element j of vector u,
  // with id idb + u * ustride + j; vectors u >= nvalid do not exist (and read as -inf); vm[u] is
  // the max of vector u.
  template <int NV, int VEC, class Get>
  __device__ __forceinline__ void step(RunLse& run, const float (&vm)[NV], int nvalid, int idb,
                                       int ustride, int tid, Get get) {
    const unsigned shared_now = *reinterpret_cast<volatile unsigned*>(block_thr);
    float tmax = vm[0];
#pragma unroll
    for (int u = 1; u < NV; ++u) tmax = fmaxf(tmax, vm[u]);
    if (tmax > run.m) {  // rare after the first steps: rescale once per step at most
      const float c = fast_exp2((run.m - tmax) * kLog2e);
      run.s0 *= c;
      run.s1 *= c;
      run.m = tmax;
      lmax[tid] = tmax;
    }
    const float mb = run.m == -INFINITY ? 0.f : run.m * kLog2e;  // all seen are -inf: exp = 0
#pragma unroll
    for (int u = 0; u < NV; ++u) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float e = fast_exp2(fmaf(get(u, j), kLog2e, -mb));
        if (((u * VEC + j) & 1) == 0) {
          run.s0 += e;
        } else {
          run.s1 += e;
        }
      }
    }
    raise(shared_now);
    if (__any_sync(kFullMask, nvalid > 0 && tmax >= thr)) hit<NV, VEC>(vm, nvalid, idb, ustride, get);
  }

  template <int NV, int VEC, class Get>
  __device__ __forceinline__ void hit(const float (&vm)[NV], int nvalid, int idb, int ustride,
                                      Get get) {
    // Tighten the bound from the block's running maxima first, so that few elements go in.
    __syncwarp();  // this warp's lmax stores are visible to its lanes
    const volatile float* lm = lmax;
    float gm = lm[lane];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) gm = fmaxf(gm, lm[w * 32 + lane]);
    unsigned key = to_key(gm);
    unsigned kth = kPadKey;
    for (int r = 0; r < k; ++r) {
      kth = warp_max_u32(key);
      const unsigned holders = __ballot_sync(kFullMask, key == kth);
      if (lane == __ffs(holders) - 1) key = kPadKey;
    }
    if (lane == 0) atomicMax(block_thr, kth);
    raise(max(kth, *reinterpret_cast<volatile unsigned*>(block_thr)));
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const bool pass = u < nvalid && vm[u] >= thr;
      if (!__any_sync(kFullMask, pass)) continue;
      if (count >= flush_at) flush();  // room for this vector: count <= 47 + 32 * VEC <= kBuf
      if (pass) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float x = get(u, j);
          if (x >= thr) {
            const unsigned kx = to_key(x);
            const int id = idb + u * ustride + j;
            // Exact: below a block-proven bound, or beaten by the warp's k-th, is out.
            if (kx >= thr_key && kbetter(kx, id, own_key, own_id)) {
              const int pos = atomicAdd(shared_count, 1);
              keys[pos] = kx;
              ids[pos] = id;
            }
          }
        }
      }
      __syncwarp();
      count = *reinterpret_cast<volatile int*>(shared_count);
    }
  }
};

template <InKind K>
__device__ __forceinline__ void tile_step(WarpTop& top, RunLse& run, const uint4 (&r)[4],
                                          int nvalid, int idb, int tid) {
  constexpr int kVec = 16 / sizeof(typename Storage<K>::T);
  float vm[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) vm[u] = vec_max<K>(r[u]);
  top.step<4, kVec>(run, vm, nvalid, idb, kThreads * kVec, tid,
                    [&](int u, int j) { return elem_of<K>(r[u], j); });
}

template <InKind K>
__device__ __forceinline__ void scalar_step(WarpTop& top, RunLse& run,
                                            const typename Storage<K>::T* base, int i, bool valid,
                                            int tid) {
  const float x = valid ? decode<K>(base[i]) : -INFINITY;
  const float vm[1] = {x};
  top.step<1, 1>(run, vm, valid ? 1 : 0, i, 0, tid, [&](int, int) { return x; });
}

template <InKind K>
// Three blocks per SM: registers for two tiles in flight per thread (the next one loads while
// this one is worked on).
__global__ void __launch_bounds__(kThreads, 3) topk_partial_kernel(
    const typename Storage<K>::T* __restrict__ logits, int64_t row_stride, int vocab, int splits,
    int chunk, int k, unsigned* __restrict__ ws_key, int* __restrict__ ws_id,
    float* __restrict__ ws_m, float* __restrict__ ws_s, float* __restrict__ logp,
    int64_t* __restrict__ ids) {
  using T = typename Storage<K>::T;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kUnroll = 4;
  constexpr int kTile = kUnroll * kThreads;  // vectors per block step
  __shared__ unsigned s_key[kWarps][kBuf];
  __shared__ int s_id[kWarps][kBuf];
  __shared__ unsigned s_top_key[kWarps * kMaxK];
  __shared__ int s_top_id[kWarps * kMaxK];
  __shared__ float s_m[kWarps], s_s[kWarps];
  __shared__ float s_lmax[kThreads];
  __shared__ unsigned s_thr;
  __shared__ int s_count[kWarps];

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  if (tid == 0) s_thr = kPadKey;
  if (tid < kWarps) s_count[tid] = 0;
  s_lmax[tid] = -INFINITY;
  __syncthreads();

  const int row = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  const int start = split * chunk;
  const int end = min(vocab, start + chunk);
  const T* base = logits + row * row_stride;

  WarpTop top;
  top.keys = s_key[warp];
  top.ids = s_id[warp];
  top.block_thr = &s_thr;
  top.shared_count = &s_count[warp];
  top.lmax = s_lmax;
  top.count = 0;
  top.k = k;
  top.lane = lane;
  top.flush_at = min(k + 32, kBuf - 32 * kVec);
  top.own_key = kPadKey;
  top.own_id = kPadId;
  top.thr_key = kPadKey;
  top.thr = -INFINITY;
  RunLse run;

  // Scalar head up to 16-byte alignment (< kVec elements), 16-byte vectors, scalar tail.
  const uintptr_t addr = reinterpret_cast<uintptr_t>(base + start);
  const int head = min(end - start, static_cast<int>(((16u - (addr & 15u)) & 15u) / sizeof(T)));
  const int vstart = start + head;
  const int nvec = (end - vstart) / kVec;
  const int vend = vstart + nvec * kVec;
  if (head > 0) scalar_step<K>(top, run, base, start + tid, tid < head, tid);

  const uint4* vp = reinterpret_cast<const uint4*>(base + vstart);
  const int full = nvec / kTile;
  uint4 a[kUnroll], b[kUnroll];
  if (full > 0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) a[u] = __ldg(vp + tid + u * kThreads);
  }
  for (int t = 0; t < full; t += 2) {  // block-uniform; a holds tile t, b is loaded for t + 1
    const int b0 = t * kTile;
    if (t + 1 < full) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) b[u] = __ldg(vp + b0 + kTile + tid + u * kThreads);
    }
    tile_step<K>(top, run, a, kUnroll, vstart + (b0 + tid) * kVec, tid);
    if (t + 1 >= full) break;
    if (t + 2 < full) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) a[u] = __ldg(vp + b0 + 2 * kTile + tid + u * kThreads);
    }
    tile_step<K>(top, run, b, kUnroll, vstart + (b0 + kTile + tid) * kVec, tid);
  }
  {
    const int b0 = full * kTile;
    if (b0 < nvec) {  // block-uniform: the last, partial tile
      int nvalid = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = b0 + tid + u * kThreads;
        if (v < nvec) {
          a[u] = __ldg(vp + v);
          ++nvalid;
        } else {
          a[u] = neg_inf_vec<K>();
        }
      }
      tile_step<K>(top, run, a, nvalid, vstart + (b0 + tid) * kVec, tid);
    }
  }
  if (vend < end) scalar_step<K>(top, run, base, vend + tid, vend + tid < end, tid);

  // Block merge: each warp's k best, then warp 0 over all of them.
  const Selected mine = flush_buffer(top.keys, top.ids, top.shared_count, top.count, k, lane);
  Lse lse;
  lse.m = run.m;
  lse.s = run.s0 + run.s1;
  lse.warp_reduce();
  if (lane < k) {
    s_top_key[warp * k + lane] = mine.key;
    s_top_id[warp * k + lane] = mine.id;
  }
  if (lane == 0) {
    s_m[warp] = lse.m;
    s_s[warp] = lse.s;
  }
  __syncthreads();
  if (warp != 0) return;
  const Selected best = warp_select<kWarps * kMaxK / 32>(s_top_key, s_top_id, kWarps * k, k, lane);
  lse = Lse();
  if (lane < kWarps) {
    lse.m = s_m[lane];
    lse.s = s_s[lane];
  }
  lse.warp_reduce();
  if (splits == 1) {
    if (lane < k) {
      const float log_z = lse.m + logf(lse.s);
      logp[row * k + lane] = from_key(best.key) - log_z;
      ids[row * k + lane] = best.id;
    }
    return;
  }
  const int slot = row * splits + split;
  if (lane < k) {
    ws_key[slot * k + lane] = best.key;
    ws_id[slot * k + lane] = best.id;
  }
  if (lane == 0) {
    ws_m[slot] = lse.m;
    ws_s[slot] = lse.s;
  }
}

__global__ void __launch_bounds__(32) topk_merge_kernel(
    int splits, int k, const unsigned* __restrict__ ws_key, const int* __restrict__ ws_id,
    const float* __restrict__ ws_m, const float* __restrict__ ws_s, float* __restrict__ logp,
    int64_t* __restrict__ ids) {
  const int row = blockIdx.x;
  const int lane = threadIdx.x;
  const int n = splits * k;
  const Selected best =
      warp_select<kMaxSplits * kMaxK / 32>(ws_key + row * n, ws_id + row * n, n, k, lane);
  Lse lse;
  if (lane < splits) {
    lse.m = ws_m[row * splits + lane];
    lse.s = ws_s[row * splits + lane];
  }
  lse.warp_reduce();
  if (lane < k) {
    const float log_z = lse.m + logf(lse.s);
    logp[row * k + lane] = from_key(best.key) - log_z;
    ids[row * k + lane] = best.id;
  }
}

template <InKind K>
void launch(const at::Tensor& logits, int k, const at::Tensor& logp, const at::Tensor& ids) {
  using T = typename Storage<K>::T;
  constexpr int kVec = 16 / sizeof(T);
  const int rows = static_cast<int>(logits.size(0));
  const int vocab = static_cast<int>(logits.size(1));
  if (rows == 0) return;
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, logits.get_device()));
  static const int per_sm = [] {
    int n = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, topk_partial_kernel<K>,
                                                                 kThreads, 0));
    return std::max(1, n);
  }();
  const int slots = sms * per_sm;
  // Chunks of at least 8192 logits (merging costs per block). Few rows: as many splits as that
  // allows, or as fit in one round of the resident slots if that round is at least 85% full (a
  // few blocks spilled into a second round cost a whole chunk's latency). Many rows: the fewest
  // splits that keep the slots busy (the last round of blocks at least 85% full), since longer
  // chunks tighten the bound sooner and need no merge.
  const int max_splits = std::min(kMaxSplits, std::max(1, vocab / 8192));
  const int one_round = slots / rows;
  int splits = max_splits;
  if (static_cast<int64_t>(rows) * max_splits > slots) {
    if (one_round >= 1 && static_cast<int64_t>(rows) * one_round * 100 >= slots * 85) {
      splits = one_round;
    } else {
      for (int s = 1; s <= max_splits; ++s) {
        const int64_t blocks = static_cast<int64_t>(rows) * s;
        const int64_t rounds = (blocks + slots - 1) / slots;
        if (blocks >= slots && blocks * 100 >= rounds * slots * 85) {
          splits = s;
          break;
        }
      }
    }
  }
  const int chunk = ceil_div(ceil_div(vocab, splits), kVec) * kVec;
  splits = ceil_div(vocab, chunk);

  auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor ws;
  unsigned* ws_key = nullptr;
  int* ws_id = nullptr;
  float* ws_m = nullptr;
  float* ws_s = nullptr;
  if (splits > 1) {
    // One allocation from torch's caching allocator (graph-capture safe): keys, ids, m, s.
    const int64_t slots = static_cast<int64_t>(rows) * splits;
    ws = at::empty({slots * (2 * k + 2)}, logits.options().dtype(at::kInt));
    ws_key = reinterpret_cast<unsigned*>(ws.data_ptr<int>());
    ws_id = ws.data_ptr<int>() + slots * k;
    ws_m = reinterpret_cast<float*>(ws.data_ptr<int>() + 2 * slots * k);
    ws_s = ws_m + slots;
  }
  const T* src = reinterpret_cast<const T*>(logits.data_ptr());
  topk_partial_kernel<K><<<rows * splits, kThreads, 0, stream>>>(
      src, logits.stride(0), vocab, splits, chunk, k, ws_key, ws_id, ws_m, ws_s,
      logp.data_ptr<float>(), ids.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (splits > 1) {
    topk_merge_kernel<<<rows, 32, 0, stream>>>(splits, k, ws_key, ws_id, ws_m, ws_s,
                                               logp.data_ptr<float>(), ids.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> topk_logprobs_cuda(const at::Tensor& logits, int64_t k) {
  check_cuda(logits, "logits");
  TORCH_CHECK(logits.dim() >= 1, "ddtree: logits must be [..., V]");
  const int64_t vocab = logits.size(-1);
  const at::Tensor rows = logits.reshape({-1, vocab});  // a view where the layout allows
  TORCH_CHECK(rows.stride(1) == 1, "ddtree: logits rows must be contiguous");
  TORCH_CHECK(vocab < INT_MAX && rows.size(0) < INT_MAX, "ddtree: logits too large");
  TORCH_CHECK(k >= 1 && k <= kMaxK && k <= vocab, "ddtree: CUDA top-k needs 1 <= k <= 16 and k <= vocab, got ", k);
  std::vector<int64_t> shape = logits.sizes().vec();
  shape.back() = k;  // [..., k], as the logits lead
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor logp = at::empty(shape, logits.options().dtype(at::kFloat));
  at::Tensor ids = at::empty(shape, logits.options().dtype(at::kLong));
  switch (in_kind(logits)) {
    case InKind::F32: launch<InKind::F32>(rows, static_cast<int>(k), logp, ids); break;
    case InKind::BF16: launch<InKind::BF16>(rows, static_cast<int>(k), logp, ids); break;
    case InKind::F16: launch<InKind::F16>(rows, static_cast<int>(k), logp, ids); break;
  }
  return {logp, ids};
}

}  // namespace ddtree

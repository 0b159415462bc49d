// zerobench CPU kernels: fused AdamW over flat partitions (ZeRO's optimizer step and ZeRO-Offload's host
// optimizer), bias+GeLU, LayerNorm, causal scaled softmax, and the multi-tensor flatten/unflatten copy.
//
// Plain C ABI over raw pointers (called through ctypes, which releases the GIL), no torch headers: the
// build takes about a second. Loops are written to vectorize with -O3 -march=native -fno-math-errno
// (vectorized sqrt needs math errno off); OpenMP splits work over a caller-given thread count so that
// several training processes on one host do not oversubscribe the cores.
//
// Dtype codes: 0 = fp32, 1 = bf16, 2 = fp16. Low-precision values travel as uint16_t bit patterns;
// fp32 -> bf16 rounds to nearest even (NaN stays NaN), fp32 -> fp16 uses the IEEE conversion (_Float16).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <omp.h>

// Vector variants of erff/expf from glibc's libmvec (linked with -lmvec): glibc only declares them under
// -ffast-math, which we do not want, so declare them here and the GeLU/softmax loops vectorize.
extern "C" {
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float expf(float);
}

namespace {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>(nan ? quiet : rounded);
}

inline float f16_to_f32(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}

inline uint16_t f32_to_f16(float f) {
  _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}

template <int K> inline float load(const void* p, int64_t i);
template <> inline float load<0>(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
template <> inline float load<1>(const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
template <> inline float load<2>(const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); }

template <int K> inline void store(void* p, int64_t i, float x);
template <> inline void store<0>(void* p, int64_t i, float x) { static_cast<float*>(p)[i] = x; }
template <> inline void store<1>(void* p, int64_t i, float x) { static_cast<uint16_t*>(p)[i] = f32_to_bf16(x); }
template <> inline void store<2>(void* p, int64_t i, float x) { static_cast<uint16_t*>(p)[i] = f32_to_f16(x); }

// Scalars derived in double precision by the caller (as torch.optim.AdamW derives them in Python), then
// rounded to float once: e.g. 1 - beta1 computed in float would differ in the last bit.
struct AdamArgs {
  float decay_keep, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, bc2_sqrt, grad_scale;
};

// The bits of x rounded to bf16 (K = 1) or fp16 (K = 2), as store<K> writes them.
template <int K> inline uint16_t low_bits(float x);
template <> inline uint16_t low_bits<1>(float x) { return f32_to_bf16(x); }
template <> inline uint16_t low_bits<2>(float x) { return f32_to_f16(x); }

// One block [start, end) of the block table; `decay` says whether weight decay applies to all of it.
// OUT < 0: no low-precision copy-out. ADOPT (OUT 1 or 2): an element of `out` whose bits are no longer p's
// rounding was changed since the last step wrote it, and the step starts from it instead of p.
template <int G, int OUT, bool ADOPT>
inline void adamw_block(float* __restrict p, const void* __restrict g, float* __restrict m, float* __restrict v,
                        void* __restrict out, int64_t start, int64_t end, bool decay, const AdamArgs& a) {
  const float keep = decay ? a.decay_keep : 1.0f;
  const float one_m_b1 = a.one_minus_beta1, one_m_b2 = a.one_minus_beta2;
#pragma omp simd
  for (int64_t i = start; i < end; ++i) {
    const float gi = load<G>(g, i) * a.grad_scale;
    const float mi = m[i] + one_m_b1 * (gi - m[i]);
    const float vi = a.beta2 * v[i] + one_m_b2 * gi * gi;
    const float denom = std::sqrt(vi) / a.bc2_sqrt + a.eps;
    float p0 = p[i];
    if constexpr (ADOPT && OUT >= 1) {
      if (static_cast<const uint16_t*>(out)[i] != low_bits<OUT>(p0)) p0 = load<OUT>(out, i);
    }
    // addcdiv_(m, denom, value=-step_size) as torch's CPU kernel evaluates it: one fused multiply-add.
    const float pi = std::fma(-a.step_size, mi / denom, p0 * keep);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (OUT >= 0) store<OUT>(out, i, pi);
  }
}

template <int G, int OUT, bool ADOPT>
void adamw_all(float* p, const void* g, float* m, float* v, void* out, const int64_t* blocks, int64_t nblocks,
               const AdamArgs& a, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t b = 0; b < nblocks; ++b)
    adamw_block<G, OUT, ADOPT>(p, g, m, v, out, blocks[3 * b], blocks[3 * b + 1], blocks[3 * b + 2] != 0, a);
}

template <int G>
void adamw_out(float* p, const void* g, float* m, float* v, void* out, int out_kind, bool adopt,
               const int64_t* blocks, int64_t nblocks, const AdamArgs& a, int threads) {
  if (out == nullptr) adamw_all<G, -1, false>(p, g, m, v, out, blocks, nblocks, a, threads);
  else if (out_kind == 1 && adopt) adamw_all<G, 1, true>(p, g, m, v, out, blocks, nblocks, a, threads);
  else if (out_kind == 1) adamw_all<G, 1, false>(p, g, m, v, out, blocks, nblocks, a, threads);
  else if (out_kind == 2 && adopt) adamw_all<G, 2, true>(p, g, m, v, out, blocks, nblocks, a, threads);
  else if (out_kind == 2) adamw_all<G, 2, false>(p, g, m, v, out, blocks, nblocks, a, threads);
  else adamw_all<G, 0, false>(p, g, m, v, out, blocks, nblocks, a, threads);
}

template <int K>
int nonfinite(const void* x, int64_t n, int threads) {
  int found = 0;
#pragma omp parallel for reduction(| : found) schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) {
    const float f = load<K>(x, i);
    found |= !(std::fabs(f) <= 3.4028234663852886e38f);  // false for inf and NaN
  }
  return found;
}

constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kSqrt2_Pi = 0.79788456080286535588f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

}  // namespace

extern "C" {

int zb_abi_version() { return 5; }

// Fused AdamW step over a flat fp32 partition. blocks: [nblocks, 3] int64 rows (start, end, decay).
// decay_keep = 1 - lr * weight_decay (applied to blocks flagged for decay), step_size = lr / (1 - beta1^t),
// bc2_sqrt = sqrt(1 - beta2^t). adopt != 0 (bf16/fp16 out): elements of out changed since the last step are
// where the step starts from (see adamw_block).
void zb_adamw(float* p, const void* g, int g_kind, float* m, float* v, void* out, int out_kind, int adopt,
              const int64_t* blocks, int64_t nblocks, float decay_keep, float beta2, float one_minus_beta1,
              float one_minus_beta2, float eps, float step_size, float bc2_sqrt, float grad_scale, int threads) {
  const AdamArgs a{decay_keep, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, bc2_sqrt, grad_scale};
  const bool ad = adopt != 0;
  if (g_kind == 1) adamw_out<1>(p, g, m, v, out, out_kind, ad, blocks, nblocks, a, threads);
  else if (g_kind == 2) adamw_out<2>(p, g, m, v, out, out_kind, ad, blocks, nblocks, a, threads);
  else adamw_out<0>(p, g, m, v, out, out_kind, ad, blocks, nblocks, a, threads);
}

// The bandwidth limit of AdamW's access pattern: 4 streams read (p, g, m, v), 3 written in place (p, m, v).
void zb_adamw_bandwidth_probe(float* p, const float* g, float* m, float* v, int64_t n, int threads) {
#pragma omp parallel for simd schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
  }
}

// 1 when any element of x is inf or NaN.
int zb_nonfinite(const void* x, int kind, int64_t n, int threads) {
  if (kind == 1) return nonfinite<1>(x, n, threads);
  if (kind == 2) return nonfinite<2>(x, n, threads);
  return nonfinite<0>(x, n, threads);
}

// y = gelu(x + bias) over [rows, n] fp32; approx 0 = erf form, 1 = tanh form.
void zb_bias_gelu_fwd(const float* x, const float* bias, float* y, int64_t rows, int64_t n, int approx, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    if (approx) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float u = xr[j] + bias[j];
        // 0.5 * (1 + tanh(z)) == sigmoid(2z): no cancellation for very negative u.
        yr[j] = u / (1.0f + std::exp(-2.0f * kSqrt2_Pi * (u + 0.044715f * u * u * u)));
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float u = xr[j] + bias[j];
        yr[j] = 0.5f * u * (1.0f + std::erf(u * kSqrt1_2));
      }
    }
  }
}

// dx = dy * gelu'(x + bias); the bias gradient is the column sum of dx (taken by the caller).
void zb_bias_gelu_bwd(const float* dy, const float* x, const float* bias, float* dx, int64_t rows, int64_t n,
                      int approx, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float* dyr = dy + r * n;
    float* dxr = dx + r * n;
    if (approx) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float u = xr[j] + bias[j];
        const float sg = 1.0f / (1.0f + std::exp(-2.0f * kSqrt2_Pi * (u + 0.044715f * u * u * u)));
        const float dinner = kSqrt2_Pi * (1.0f + 3.0f * 0.044715f * u * u);
        dxr[j] = dyr[j] * (sg + 2.0f * u * sg * (1.0f - sg) * dinner);
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float u = xr[j] + bias[j];
        const float cdf = 0.5f * (1.0f + std::erf(u * kSqrt1_2));
        const float pdf = kInvSqrt2Pi * std::exp(-0.5f * u * u);
        dxr[j] = dyr[j] * (cdf + u * pdf);
      }
    }
  }
}

// LayerNorm over the last dim of [rows, n] fp32; writes y, mean[rows], rstd[rows].
void zb_layer_norm_fwd(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                       int64_t rows, int64_t n, float eps, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += xr[j];
    const float mu = static_cast<float>(s / n);
    double q = 0.0;
#pragma omp simd reduction(+ : q)
    for (int64_t j = 0; j < n; ++j) q += (xr[j] - mu) * (xr[j] - mu);
    const float rs = 1.0f / std::sqrt(static_cast<float>(q / n) + eps);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mu) * rs * w[j] + b[j];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// LayerNorm backward: dx [rows, n]; dw, db [n] (summed over rows; per-thread partials, then reduced).
void zb_layer_norm_bwd(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                       float* dx, float* dw, float* db, int64_t rows, int64_t n, int threads) {
  std::vector<double> part(static_cast<size_t>(threads) * 2 * n, 0.0);
#pragma omp parallel num_threads(threads)
  {
    double* pdw = part.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * n;
    double* pdb = pdw + n;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * n;
      const float* dyr = dy + r * n;
      float* dxr = dx + r * n;
      const float mu = mean[r], rs = rstd[r];
      float a = 0.0f, c = 0.0f;  // mean(dy*w), mean(dy*w*xhat)
#pragma omp simd reduction(+ : a, c)
      for (int64_t j = 0; j < n; ++j) {
        const float xhat = (xr[j] - mu) * rs;
        const float g = dyr[j] * w[j];
        a += g;
        c += g * xhat;
        pdw[j] += dyr[j] * xhat;
        pdb[j] += dyr[j];
      }
      a /= n;
      c /= n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float xhat = (xr[j] - mu) * rs;
        dxr[j] = rs * (dyr[j] * w[j] - a - xhat * c);
      }
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    double sw = 0.0, sb = 0.0;
    for (int t = 0; t < threads; ++t) {
      sw += part[static_cast<size_t>(t) * 2 * n + j];
      sb += part[static_cast<size_t>(t) * 2 * n + n + j];
    }
    dw[j] = static_cast<float>(sw);
    db[j] = static_cast<float>(sb);
  }
}

// Causal scaled softmax over [batch, s, s] fp32 scores: row i keeps columns <= i; masked entries are 0, or NaN
// where the row's sum is (a NaN or an inf in the row), as torch's softmax over the -inf-filled row gives.
void zb_causal_softmax_fwd(const float* x, float* y, int64_t batch, int64_t s, float scale, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < batch * s; ++r) {
    const int64_t i = r % s;
    const float* xr = x + r * s;
    float* yr = y + r * s;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j <= i; ++j) mx = std::fmax(mx, xr[j] * scale);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j <= i; ++j) {
      yr[j] = std::exp(xr[j] * scale - mx);
      sum += yr[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) yr[j] *= inv;
    for (int64_t j = i + 1; j < s; ++j) yr[j] = 0.0f * inv;
  }
}

// dx = scale * y * (dy - sum_j dy*y) over the kept columns j <= i; masked entries get 0 (the mask's gradient),
// also in a row whose y is NaN.
void zb_causal_softmax_bwd(const float* dy, const float* y, float* dx, int64_t batch, int64_t s, float scale,
                           int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < batch * s; ++r) {
    const int64_t i = r % s;
    const float* dyr = dy + r * s;
    const float* yr = y + r * s;
    float* dxr = dx + r * s;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j <= i; ++j) dot += dyr[j] * yr[j];
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) dxr[j] = scale * yr[j] * (dyr[j] - dot);
    for (int64_t j = i + 1; j < s; ++j) dxr[j] = 0.0f;
  }
}

// Multi-tensor copy between a flat buffer and n tensors: pieces[k] = (tensor index, tensor offset,
// flat offset, bytes); unpack != 0 copies flat -> tensors. Pieces are split by the caller so that the
// work balances over threads.
void zb_flat_copy(char* flat, char** tensors, const int64_t* pieces, int64_t npieces, int unpack, int threads) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t k = 0; k < npieces; ++k) {
    const int64_t* pc = pieces + 4 * k;
    char* t = tensors[pc[0]] + pc[1];
    char* f = flat + pc[2];
    if (unpack) std::memcpy(t, f, static_cast<size_t>(pc[3]));
    else std::memcpy(f, t, static_cast<size_t>(pc[3]));
  }
}

}  // extern "C"

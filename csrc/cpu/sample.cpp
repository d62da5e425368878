// A step's picks and log-normalizers in one pass per row (chatpage/engine/sample/sampler.py's torch
// code is the specification: its greedy argmax, its logsumexp, and its draw of a row with neither
// top-k nor top-p from the whole vocabulary by the inverse of the cumulative weights).
//
// Per row of logits: the largest logit m and its first index; S = sum exp(x - m), so the row's
// log-normalizer is m + log S; and for a row drawn at temperature T the weights w = exp((x - m)
// / T) (the best token weighs 1), their total W, and the index that u * W lands on when the
// weights are laid end to end (always a positive weight's). The torch code makes about eight
// passes over a 49k-logit row and allocates for most of them; this reads a row three times (two
// at T = 1: its weights are then S's terms) and allocates nothing per row. Sums are taken eight
// lanes at a time, so a draw may differ from the torch code's where u * W falls within rounding
// of a boundary between two tokens: the distribution is the same.
#include "checks.h"
#include "cpu/ops_cpu.h"
#include "cpu/vec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace chatpage::cpu {
namespace {

constexpr int64_t kRowGrain = 4;  // rows per task: a row is ~50k logits

struct Row {
  int64_t pick;  // argmax (greedy) or the draw; -1: the row is not finite
  float lse;
};

// sum over x of exp((x - m) * scale), eight lanes at a time (then the lanes' sum)
inline float exp_sum(const float* x, int64_t v, float m, float inv_t) {
  const Vec8 mv = splat8(m), iv = splat8(inv_t);
  Vec8 acc = zero8();
  int64_t i = 0;
  for (; i + 8 <= v; i += 8) acc = add8(acc, exp8(mul8(sub8(load8(x + i), mv), iv)));
  float sum = hsum8(acc);
  for (; i < v; ++i) sum += std::exp((x[i] - m) * inv_t);
  return sum;
}

Row one_row(const float* x, int64_t v, float temperature, double u) {
  Vec8 best = splat8(kNegInf);
  int64_t i = 0;
  for (; i + 8 <= v; i += 8) best = max8(best, load8(x + i));
  float m = hmax8(best);
  for (; i < v; ++i) m = std::max(m, x[i]);
  bool nan = false;  // (max8 passes NaN over)
  for (int64_t j = 0; j < v; ++j) nan |= x[j] != x[j];
  if (nan || !std::isfinite(m)) return {-1, 0.f};  // NaN or +-inf: the torch code takes it
  int64_t first = 0;
  while (x[first] != m) ++first;
  const float sum = exp_sum(x, v, m, 1.f);
  const Row greedy{first, m + std::log(sum)};
  if (!(temperature > 0.f)) return greedy;
  // w = exp((x - m) / T), as the torch code divides (x - m) by T
  // (an infinite temperature weighs every finite logit alike: 1 / T at least 1e-30 keeps a
  // masked logit's (x - m) / T at -inf, not -inf * 0)
  const float inv_t = 1.f / temperature >= 1e-30f ? 1.f / temperature : 1e-30f;
  const bool plain = temperature == 1.f;
  const float total = plain ? sum : exp_sum(x, v, m, inv_t);
  const float target = static_cast<float>(u * static_cast<double>(total));
  // eight weights at a time; the lanes one by one only in the group where the sum passes target
  const Vec8 mv = splat8(m), iv = splat8(inv_t);
  float run = 0.f;
  int64_t last_group = -1;  // the last group of eight with a positive weight
  int64_t j = 0;
  for (; j + 8 <= v; j += 8) {
    const Vec8 w = exp8(mul8(sub8(load8(x + j), mv), iv));
    const float group = hsum8(w);
    if (!(group > 0.f)) continue;
    last_group = j;
    if (run + group <= target) {
      run += group;
      continue;
    }
    alignas(32) float lanes[8];
    store8(lanes, w);
    for (int k = 0; k < 8; ++k) {
      run += lanes[k];
      if (lanes[k] > 0.f && run > target) return {j + k, greedy.lse};
    }
  }
  int64_t last_positive = first;  // the best token weighs 1
  if (last_group >= 0) {
    alignas(32) float lanes[8];
    store8(lanes, exp8(mul8(sub8(load8(x + last_group), mv), iv)));
    for (int k = 0; k < 8; ++k)
      if (lanes[k] > 0.f) last_positive = last_group + k;
  }
  for (; j < v; ++j) {
    const float w = std::exp((x[j] - m) * inv_t);
    if (!(w > 0.f)) continue;
    last_positive = j;
    run += w;
    if (run > target) return {j, greedy.lse};
  }
  return {last_positive, greedy.lse};  // rounding carried u * W past the end
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> sample_rows(const at::Tensor& logits,
                                               const at::Tensor& temperatures,
                                               const at::Tensor& uniforms) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() &&
                  logits.device().is_cpu(),
              "chatpage::sample_rows: logits must be a contiguous float32 [rows, vocab] CPU tensor");
  const int64_t n = logits.size(0), v = logits.size(1);
  TORCH_CHECK(v > 0, "chatpage::sample_rows: the vocabulary is empty");
  TORCH_CHECK(temperatures.scalar_type() == at::kFloat && temperatures.numel() == n &&
                  temperatures.is_contiguous(),
              "chatpage::sample_rows: temperatures must be float32 with one value per row");
  TORCH_CHECK(uniforms.scalar_type() == at::kDouble && uniforms.numel() == n &&
                  uniforms.is_contiguous(),
              "chatpage::sample_rows: uniforms must be float64 with one value per row");
  at::Tensor picks = at::empty({n}, logits.options().dtype(at::kLong));
  at::Tensor lse = at::empty({n}, logits.options());
  const float* x = logits.data_ptr<float>();
  const float* t = temperatures.data_ptr<float>();
  const double* u = uniforms.data_ptr<double>();
  int64_t* p = picks.data_ptr<int64_t>();
  float* l = lse.data_ptr<float>();
  at::parallel_for(0, n, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const Row row = one_row(x + r * v, v, t[r], u[r]);
      p[r] = row.pick;
      l[r] = row.lse;
    }
  });
  return {picks, lse};
}

// The grammar's mask on a step's logits: every token whose bit is 0 becomes -inf, 32 tokens a
// word; a word of all ones (every token allowed) is skipped, one of zeros filled at once.
void forbid_tokens(at::Tensor& logits, const at::Tensor& bitmask) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() &&
                  logits.device().is_cpu(),
              "chatpage::forbid_tokens: logits must be a contiguous float32 [rows, vocab] CPU tensor");
  const int64_t n = logits.size(0), v = logits.size(1), words = (v + 31) / 32;
  TORCH_CHECK(bitmask.scalar_type() == at::kInt && bitmask.is_contiguous() && bitmask.dim() == 2 &&
                  bitmask.size(0) == n && bitmask.size(1) >= words && bitmask.device().is_cpu(),
              "chatpage::forbid_tokens: bitmask must be a contiguous int32 CPU tensor of [rows, "
              "ceil(vocab / 32)] words or more");
  float* x = logits.data_ptr<float>();
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>());
  const int64_t stride = bitmask.size(1);
  at::parallel_for(0, n, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* row = x + r * v;
      const uint32_t* mask = bits + r * stride;
      for (int64_t w = 0; w < words; ++w) {
        const uint32_t m = mask[w];
        if (m == 0xFFFFFFFFu) continue;
        const int64_t first = 32 * w, count = std::min<int64_t>(32, v - first);
        for (int64_t i = 0; i < count; ++i)
          if (!((m >> i) & 1u)) row[first + i] = kNegInf;
      }
    }
  });
}

}  // namespace chatpage::cpu

// A span of decoder layers over a few rows (decoding, verification) in one call from Python.
//
// Why: at decode sizes the Python around the kernels cost as much as a small model's arithmetic: ~11
// kernel calls a layer, each with its ctypes conversion, output allocation and tensor views, came to
// tenths of a millisecond a layer on a 2 GHz core, a quarter of a 135M model's step.
// Here the layers' steps are the very kernels models/llama.py used to call one by one, in the same order
// on the same inputs, so every value is bit-identical to that path (and rows stay identical to their
// one-token steps): only the dispatch moved.
//
// One layer, T rows of width C (x updated in place):
//   normed  = RMSNorm(x) * w_in
//   qkv     = normed @ Wqkv (+ bias)                      (T, (H + 2 Hkv) D)
//   q, k    = RMSNorm of each head * w_q, w_k             (Qwen3's query/key norms, where the layer has them)
//   q       = rope(q); rope(k) and v -> the layer's cache slots [start, start + T)
//   x       = x + (attention(q, cache) @ Wo (+ bias))     (add_rms_norm keeps the sum; gpt-oss: sinks)
//   normed  = RMSNorm(x) * w_post
//   x       = x + (silu(gate) * up) @ Wdown (+ bias)      (gate, up = normed @ Wgate_up)
//             or a mixture of experts' sum over the experts its router picks (mixture_of_experts below)
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "vector_math.h"

extern "C" {
void packed_matmul_f32(const float* x, const float* wp, float* y, int64_t T, int64_t K, int64_t N, int num_threads);
void packed_matmul_bf16(const float* x, const uint16_t* wp, float* y, int64_t T, int64_t K, int64_t N, int num_threads);
void packed_matmul_f16(const float* x, const uint16_t* wp, float* y, int64_t T, int64_t K, int64_t N, int num_threads);
void packed_matmul_q8(const float* x, const int8_t* wq, const float* scales, float* y, int64_t T, int64_t K,
                      int64_t N, int num_threads);
void int4_matmul(const float* x, const uint8_t* wq, const uint16_t* scales, float* y, int64_t T, int64_t K, int64_t N,
                 int64_t G, int num_threads);
void int7_matmul(const float* x, const uint8_t* wq, const uint16_t* scales, float* y, int64_t T, int64_t K, int64_t N,
                 int64_t G, int num_threads);
void gguf_matmul(const float* x, const uint8_t* codes, const int8_t* group_codes, const uint16_t* super, float* y,
                 int64_t T, int64_t K, int64_t N, int32_t layout, int64_t group, int64_t super_size, int num_threads);
void attention_block(const float* q, const void* keys, const void* values, float* out, int64_t T, int64_t H,
                     int64_t Hkv, int64_t D, int64_t start, int64_t head_stride, float scale, const float* sinks,
                     int kv_type, int num_threads);
void attention_rows(const float* q, const void* keys, const void* values, const uint8_t* visible, float* out,
                    int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t prefix, int64_t visible_width,
                    int64_t head_stride, float scale, const float* sinks, int kv_type, int num_threads);
void add_rms_norm(const float* x, const float* residual, const float* weight, float* sum, float* out, int64_t rows,
                  int64_t n, float eps);
void rope_qkv_to_cache(const float* qkv, const float* cos, const float* sin, float* q_out, void* key_cache,
                       void* value_cache, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t start,
                       int64_t head_stride, int kv_type);
void silu_mul(const float* gate_up, float* out, int64_t T, int64_t I);
void clamped_swiglu_mul(const float* gate_up, float* out, int64_t T, int64_t I, float limit, float alpha);
}

namespace {

// One PackedLinear as models/layer_plan.py describes it (a ctypes Structure of the same layout).
enum MatrixKind : int32_t { FLOAT32 = 0, INT8 = 1, INT4 = 2, INT7 = 3, GGUF = 4, BF16 = 5, FP16 = 6 };

struct PackedMatrix {
    int32_t kind;
    int32_t gguf_layout;
    const void* codes;         // float32, bf16, fp16 or int8 panels, or uint8 codes
    const void* scales;        // int8: float per column; int4/int7: float16 groups; gguf: int8 group codes
    const void* super_scales;  // gguf only: float16 d/dmin
    const float* bias;         // or null
    int64_t in_features, out_features, group, super_group;
};

// A mixture-of-experts feed-forward (models/llama.py: MixtureOfExperts): the router, each expert's packed
// gate/up and down, and how the router's scores become each row's picks and weights.
struct MixtureWeights {
    PackedMatrix router;
    const PackedMatrix* gate_up;
    const PackedMatrix* down;
    int64_t num_experts, top_k;
    int32_t softmax_after_topk;  // gpt-oss: softmax over the picked logits; else over all, then the top ones
    int32_t normalize;           // Qwen3's norm_topk_prob: the picked probabilities renormalized
    float limit, alpha;          // gpt-oss's clamped SwiGLU (limit 0: silu)
    int64_t* touched;            // out: the distinct experts the last call ran
};

struct LayerWeights {
    PackedMatrix qkv, o, gate_up, down;  // gate_up, down: unused where `mixture` is set
    const float* input_norm;
    const float* post_norm;
    float input_eps, post_eps;
    const float* q_norm;  // (D,) each query head's RMSNorm weight, or null
    const float* k_norm;
    float qk_eps;
    const float* sinks;   // (H,) or null
    const MixtureWeights* mixture;  // or null: the dense gate_up/down
    int64_t sliding;      // a sliding-window layer: each row sees the cache from its segment's first_key on
};

// y (T, N) = x (T, K) @ W (+ bias), the kernel PackedLinear.unsplit picks for W's format.
void multiply(const PackedMatrix& w, const float* x, float* y, int64_t T, int threads) {
    const int64_t K = w.in_features, N = w.out_features;
    switch (w.kind) {
        case FLOAT32: packed_matmul_f32(x, static_cast<const float*>(w.codes), y, T, K, N, threads); break;
        case BF16: packed_matmul_bf16(x, static_cast<const uint16_t*>(w.codes), y, T, K, N, threads); break;
        case FP16: packed_matmul_f16(x, static_cast<const uint16_t*>(w.codes), y, T, K, N, threads); break;
        case INT8:
            packed_matmul_q8(x, static_cast<const int8_t*>(w.codes), static_cast<const float*>(w.scales), y, T, K, N,
                             threads);
            break;
        case INT4:
            int4_matmul(x, static_cast<const uint8_t*>(w.codes), static_cast<const uint16_t*>(w.scales), y, T, K, N,
                        w.group, threads);
            break;
        case INT7:
            int7_matmul(x, static_cast<const uint8_t*>(w.codes), static_cast<const uint16_t*>(w.scales), y, T, K, N,
                        w.group, threads);
            break;
        default:
            gguf_matmul(x, static_cast<const uint8_t*>(w.codes), static_cast<const int8_t*>(w.scales),
                        static_cast<const uint16_t*>(w.super_scales), y, T, K, N, w.gguf_layout, w.group,
                        w.super_group, threads);
    }
    if (w.bias != nullptr)
        for (int64_t t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++) y[t * N + n] += w.bias[n];
}

}  // namespace

// One request's rows within a forward (models/layer_plan.py's Segment has the same layout): its batch-1
// cache's first layer's (Hkv, S_max, D) key and value blocks of kv_type elements (vector_math.h), layer_stride
// elements apart, heads head_stride apart; `start` cached tokens precede its `rows` new ones, whose keys and
// values go to [start, start + rows).
// Attention: each row sees the first `prefix` keys; visible (rows, start + rows - prefix) uint8 says which of
// the others it sees; on sliding-window layers, none before first_key[row] (null: no window reached yet).
// visible null: a prefill block, row r seeing keys [0, start + r] through block_attention.cpp.
struct Segment {
    void* key_cache;
    void* value_cache;
    int64_t layer_stride, head_stride;
    const uint8_t* visible;
    int64_t prefix, rows, start, kv_type;
    const int64_t* first_key;

    void* layer_keys(int64_t l) const { return layer_of(key_cache, l); }
    void* layer_values(int64_t l) const { return layer_of(value_cache, l); }
    void* layer_of(void* cache, int64_t l) const {
        return static_cast<char*>(cache) + l * layer_stride * vector_math::kv_element_size(kv_type);
    }
};

namespace {

void run_experts(const PackedMatrix* gate_up, const PackedMatrix* down, int64_t num_experts, const float* x,
                 const int64_t* experts, const float* weights, float* out, int64_t T, int64_t top_k, float limit,
                 float alpha, int num_threads);

// Each head's RMSNorm in place: `heads` heads of D floats from `offset` in each of the T rows of `width`.
void normalize_heads(float* rows, int64_t T, int64_t width, int64_t offset, int64_t heads, int64_t D,
                     const float* weight, float eps) {
    std::vector<float> normed(D);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++) {
            float* head = rows + t * width + offset + h * D;
            add_rms_norm(head, nullptr, weight, head, normed.data(), 1, D, eps);
            std::copy(normed.begin(), normed.end(), head);
        }
}

// A row's picks from its router logits (E,): the top_k experts best first (ties: the lower index) and their
// weights, as MixtureOfExperts.route computes them.
void pick_experts(const MixtureWeights& m, const float* logits, int64_t* experts, float* weights) {
    const int64_t E = m.num_experts, k = m.top_k;
    std::vector<float> scores(logits, logits + E);
    if (!m.softmax_after_topk) {  // softmax over every expert first
        float top = scores[0], total = 0.0f;
        for (int64_t e = 1; e < E; e++) top = std::max(top, scores[e]);
        for (int64_t e = 0; e < E; e++) total += (scores[e] = expf(scores[e] - top));
        for (int64_t e = 0; e < E; e++) scores[e] /= total;
    }
    std::vector<bool> taken(E, false);
    for (int64_t r = 0; r < k; r++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || scores[e] > scores[best])) best = e;
        taken[best] = true;
        experts[r] = best, weights[r] = scores[best];
    }
    if (m.softmax_after_topk) {  // softmax over the picked logits
        const float top = weights[0];
        float total = 0.0f;
        for (int64_t r = 0; r < k; r++) total += (weights[r] = expf(weights[r] - top));
        for (int64_t r = 0; r < k; r++) weights[r] /= total;
    } else if (m.normalize) {
        float total = 0.0f;
        for (int64_t r = 0; r < k; r++) total += weights[r];
        for (int64_t r = 0; r < k; r++) weights[r] /= total;
    }
}

// The mixture's feed-forward over T rows of normed (T, C) into out (T, C).
void mixture(const MixtureWeights& m, const float* normed, float* out, int64_t T, int num_threads) {
    std::vector<float> logits(T * m.num_experts), weights(T * m.top_k);
    std::vector<int64_t> experts(T * m.top_k);
    multiply(m.router, normed, logits.data(), T, num_threads);
    std::vector<bool> used(m.num_experts, false);
    for (int64_t t = 0; t < T; t++) {
        pick_experts(m, logits.data() + t * m.num_experts, experts.data() + t * m.top_k, weights.data() + t * m.top_k);
        for (int64_t r = 0; r < m.top_k; r++) used[experts[t * m.top_k + r]] = true;
    }
    if (m.touched != nullptr) *m.touched = std::count(used.begin(), used.end(), true);
    run_experts(m.gate_up, m.down, m.num_experts, normed, experts.data(), weights.data(), out, T, m.top_k, m.limit,
                m.alpha, num_threads);
}

// Row r of a segment on a sliding-window layer, as a call of its own over the cache from slot
// min(first_key[r], prefix) on (attention.RowAttention.row_alone): the keys before its window left out.
void windowed_row(const Segment& seg, int64_t r, const float* q, void* keys, void* values, float* out, int64_t H,
                  int64_t Hkv, int64_t D, float attention_scale, const float* sinks, int num_threads) {
    const int64_t first = seg.first_key[r], start = std::min(first, seg.prefix);
    const int64_t width = seg.start + seg.rows - seg.prefix;
    std::vector<uint8_t> visible(seg.visible + r * width, seg.visible + (r + 1) * width);
    if (first > seg.prefix) std::fill(visible.begin(), visible.begin() + (first - seg.prefix), 0);
    std::vector<float> row_q(H * D);  // q is (H, rows, D)
    for (int64_t h = 0; h < H; h++) std::copy(q + (h * seg.rows + r) * D, q + (h * seg.rows + r + 1) * D, row_q.data() + h * D);
    const int64_t offset = start * D * vector_math::kv_element_size(seg.kv_type);
    attention_rows(row_q.data(), static_cast<char*>(keys) + offset, static_cast<char*>(values) + offset, visible.data(),
                   out + r * H * D, 1, H, Hkv, D, seg.prefix - start, width, seg.head_stride, attention_scale, sinks,
                   (int)seg.kv_type, num_threads);
}

// Layers [0, count) over x (T, C), in place, T the segments' rows together. The projections, norms and the
// feed-forward run over all T rows at once (each kernel computes a row the same whatever T: rows stay
// bit-identical to a segment run alone); rope, the cache writes and attention run segment by segment.
void run_layers(const LayerWeights* layers, int64_t count, float* x, const float* cos, const float* sin,
                const Segment* segments, int64_t num_segments, int64_t H, int64_t Hkv, int64_t D,
                float attention_scale, int num_threads) {
    if (count <= 0 || num_segments <= 0) return;
    int64_t T = 0, most_rows = 0;
    for (int64_t s = 0; s < num_segments; s++) {
        T += segments[s].rows;
        if (segments[s].rows > most_rows) most_rows = segments[s].rows;
    }
    const int64_t C = layers[0].qkv.in_features;
    std::vector<float> normed(T * C), sum(T * C), q(H * most_rows * D), attended(T * H * D), projected(T * C);
    std::vector<float> qkv, gate_up, activated;
    for (int64_t l = 0; l < count; l++) {
        const LayerWeights& layer = layers[l];
        const int64_t width = layer.qkv.out_features;
        qkv.resize(T * width);

        add_rms_norm(x, nullptr, layer.input_norm, x, normed.data(), T, C, layer.input_eps);
        multiply(layer.qkv, normed.data(), qkv.data(), T, num_threads);
        if (layer.q_norm != nullptr) {
            normalize_heads(qkv.data(), T, width, 0, H, D, layer.q_norm, layer.qk_eps);
            normalize_heads(qkv.data(), T, width, H * D, Hkv, D, layer.k_norm, layer.qk_eps);
        }
        int64_t row = 0;
        for (int64_t s = 0; s < num_segments; s++) {
            const Segment& seg = segments[s];
            void* keys = seg.layer_keys(l);
            void* values = seg.layer_values(l);
            rope_qkv_to_cache(qkv.data() + row * width, cos + row * D, sin + row * D, q.data(), keys, values,
                              seg.rows, H, Hkv, D, seg.start, seg.head_stride, (int)seg.kv_type);
            if (seg.visible == nullptr) {
                attention_block(q.data(), keys, values, attended.data() + row * H * D, seg.rows, H, Hkv, D, seg.start,
                                seg.head_stride, attention_scale, layer.sinks, (int)seg.kv_type, num_threads);
            } else if (layer.sliding && seg.first_key != nullptr) {
                for (int64_t r = 0; r < seg.rows; r++)
                    windowed_row(seg, r, q.data(), keys, values, attended.data() + row * H * D, H, Hkv, D,
                                 attention_scale, layer.sinks, num_threads);
            } else {
                attention_rows(q.data(), keys, values, seg.visible, attended.data() + row * H * D, seg.rows, H, Hkv,
                               D, seg.prefix, seg.start + seg.rows - seg.prefix, seg.head_stride, attention_scale,
                               layer.sinks, (int)seg.kv_type, num_threads);
            }
            row += seg.rows;
        }
        multiply(layer.o, attended.data(), projected.data(), T, num_threads);
        add_rms_norm(x, projected.data(), layer.post_norm, sum.data(), normed.data(), T, C, layer.post_eps);
        if (layer.mixture != nullptr) {
            mixture(*layer.mixture, normed.data(), projected.data(), T, num_threads);
        } else {
            const int64_t I = layer.gate_up.out_features / 2;
            gate_up.resize(T * 2 * I);
            activated.resize(T * I);
            multiply(layer.gate_up, normed.data(), gate_up.data(), T, num_threads);
            silu_mul(gate_up.data(), activated.data(), T, I);
            multiply(layer.down, activated.data(), projected.data(), T, num_threads);
        }
        for (int64_t i = 0; i < T * C; i++) x[i] = sum[i] + projected[i];
    }
}

}  // namespace

// Layers [0, count) of `layers` over the T rows of one request (a Segment spelled out), in place.
extern "C" void decoder_layers(const LayerWeights* layers, int64_t count, float* x, const float* cos, const float* sin,
                               void* key_cache, void* value_cache, int64_t layer_stride, int64_t head_stride,
                               const uint8_t* visible, int64_t prefix, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                               int64_t start, int64_t kv_type, const int64_t* first_key, float attention_scale,
                               int num_threads) {
    const Segment one{key_cache, value_cache, layer_stride, head_stride, visible, prefix, T, start, kv_type,
                      first_key};
    run_layers(layers, count, x, cos, sin, &one, 1, H, Hkv, D, attention_scale, num_threads);
}

// The same over several requests' rows in one pass (a batched verification): x (sum of rows, C), cos/sin
// (sum of rows, D), the requests' rows in segment order.
extern "C" void decoder_layers_batch(const LayerWeights* layers, int64_t count, float* x, const float* cos,
                                     const float* sin, const Segment* segments, int64_t num_segments, int64_t H,
                                     int64_t Hkv, int64_t D, float attention_scale, int num_threads) {
    run_layers(layers, count, x, cos, sin, segments, num_segments, H, Hkv, D, attention_scale, num_threads);
}

// A mixture of experts' feed-forward over T rows (models/llama.py: MixtureOfExperts): row t picked the experts
// experts[t, r] with weights[t, r] (r < top_k, best first); out[t] = the sum, over r in rank order, of
// weights[t, r] * down_e(silu(gate) * up) with gate, up = gate_up_e(x[t]) (limit > 0: gpt-oss's clamped SwiGLU
// with `limit` and `alpha` instead; biases where the matrices have them). The rows that picked an expert go
// through it together, its weights read once; every product is the kernels' row-count-invariant one, so a row
// computes the same whichever rows share its pass (a verification's rows as one-token steps).
extern "C" void mixture_of_experts(const PackedMatrix* gate_up, const PackedMatrix* down, int64_t num_experts,
                                   const float* x, const int64_t* experts, const float* weights, float* out,
                                   int64_t T, int64_t top_k, float limit, float alpha, int num_threads) {
    run_experts(gate_up, down, num_experts, x, experts, weights, out, T, top_k, limit, alpha, num_threads);
}

namespace {

void run_experts(const PackedMatrix* gate_up, const PackedMatrix* down, int64_t num_experts, const float* x,
                 const int64_t* experts, const float* weights, float* out, int64_t T, int64_t top_k, float limit,
                 float alpha, int num_threads) {
    const int64_t C = down[0].out_features, I = down[0].in_features;
    std::vector<float> picked(T * top_k * C), rows, gate_up_out, activated, projected;
    std::vector<int64_t> slots;  // (row, rank) pairs as row * top_k + rank
    for (int64_t e = 0; e < num_experts; e++) {
        slots.clear();
        for (int64_t s = 0; s < T * top_k; s++)
            if (experts[s] == e) slots.push_back(s);
        if (slots.empty()) continue;
        const int64_t n = static_cast<int64_t>(slots.size());
        rows.resize(n * C);
        gate_up_out.resize(n * 2 * I);
        activated.resize(n * I);
        projected.resize(n * C);
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < C; c++) rows[i * C + c] = x[(slots[i] / top_k) * C + c];
        multiply(gate_up[e], rows.data(), gate_up_out.data(), n, num_threads);
        if (limit > 0)
            clamped_swiglu_mul(gate_up_out.data(), activated.data(), n, I, limit, alpha);
        else
            silu_mul(gate_up_out.data(), activated.data(), n, I);
        multiply(down[e], activated.data(), projected.data(), n, num_threads);
        for (int64_t i = 0; i < n; i++) {
            const float weight = weights[slots[i]];
            for (int64_t c = 0; c < C; c++) picked[slots[i] * C + c] = projected[i * C + c] * weight;
        }
    }
    for (int64_t t = 0; t < T; t++) {
        for (int64_t c = 0; c < C; c++) out[t * C + c] = picked[t * top_k * C + c];
        for (int64_t r = 1; r < top_k; r++)
            for (int64_t c = 0; c < C; c++) out[t * C + c] += picked[(t * top_k + r) * C + c];
    }
}

}  // namespace

// hearsay-bench codec: encode and decode-accumulate throughput of every codec, in GB/s of
// fp32 input, with the compression ratio, beside memcpy and a dense add (y += x) of the
// same size measured in the same rounds (one thread).
#include <cmath>
#include <cstring>

#include "bench_util.h"
#include "hearsay/codec.h"
#include "hearsay/command_line.h"
#include "hearsay/error.h"
#include "hearsay/rng.h"

namespace hearsay::bench {
namespace {

struct Options {
  std::vector<size_t> sizes{1u << 20, 25u << 20};
  std::vector<std::string> codecs = codec_names();
  int repeats = 5;
  double round_s = 0.25;
};

Options parse(int argc, char** argv) {
  Options o;
  CommandLine("codec bench")
      .size_list("--sizes", &o.sizes, 1, size_t{1} << 31, "a list of element counts")
      .text_list("--codecs", &o.codecs, "a list of codec names")
      .integer("--repeats", &o.repeats, 1, 1000, "a number of rounds")
      .number("--round-s", &o.round_s, 1e-3, 3600, "a number of seconds")
      .parse(argc, argv, 0);
  return o;
}

std::string human(size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, n % (1u << 20) == 0 ? "%zuM" : "%zu", n % (1u << 20) == 0 ? n >> 20 : n);
  return buf;
}

// The tensor seen as square-ish matrices of 1024 columns, for powersgd.
std::vector<ParamView> matrix_layout(size_t n) {
  std::vector<ParamView> l;
  const size_t cols = 1024, rows_per = 1024;
  for (size_t off = 0; off + rows_per * cols <= n; off += rows_per * cols) {
    ParamView v;
    v.name = "w";
    v.name += std::to_string(off);
    v.offset = off;
    v.size = rows_per * cols;
    v.shape = {static_cast<int>(rows_per), static_cast<int>(cols)};
    l.push_back(std::move(v));
  }
  return l;
}

}  // namespace

int run_codec_bench(int argc, char** argv) {
  const Options o = parse(argc, argv);
  for (const auto& name : o.codecs) {
    CodecSpec s;
    s.name = name;
    check_codec_spec(s);
  }
  for (size_t n : o.sizes) {
    Rng rng(1);
    std::vector<float> x(n), y(n, 0.0f), dst(n);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    const double gb = 4.0 * static_cast<double>(n) / 1e9;

    struct Case {
      std::string label;
      std::unique_ptr<Codec> codec;
      std::vector<uint8_t> payload;
      CodecParams params;
    };
    std::vector<Case> cases;
    for (const auto& name : o.codecs) {
      CodecSpec s;
      s.name = name;
      cases.push_back({name, make_codec(s, matrix_layout(n), 7), {}, {}});
      if (name == "topk") {
        s.exact_topk = true;
        cases.push_back({"topk_exact", make_codec(s, matrix_layout(n), 7), {}, {}});
      }
    }
    std::vector<std::function<double(int)>> bodies;
    bodies.push_back(timed([&] { std::memcpy(dst.data(), x.data(), 4 * n); }));
    bodies.push_back(timed([&] {
      for (size_t i = 0; i < n; ++i) y[i] += x[i];
    }));
    for (auto& c : cases) {
      c.codec->encode(x.data(), n, 0, c.payload, c.params);  // a payload for the decoder
      bodies.push_back(timed([&c, &x, n] { c.codec->encode(x.data(), n, 0, c.payload, c.params); }));
      bodies.push_back(timed([&c, &y, n] {
        const std::string err = decode_accumulate(c.params, c.payload.data(), c.payload.size(), 1e-6f, y.data(), n);
        HEARSAY_CHECK(err.empty(), err);
      }));
    }
    const auto t = time_interleaved(bodies, o.repeats, o.round_s);
    const double memcpy_gbps = gb / median(t[0]), add_gbps = gb / median(t[1]);
    JsonObject base;
    base.add("elements", static_cast<int64_t>(n)).add("repeats", o.repeats);
    emit("codec", "memcpy n=" + human(n), "GBps", memcpy_gbps, "GB/s", &base);
    emit("codec", "dense_add n=" + human(n), "GBps", add_gbps, "GB/s", &base);
    for (size_t i = 0; i < cases.size(); ++i) {
      const double enc = gb / median(t[2 + 2 * i]), dec = gb / median(t[3 + 2 * i]);
      JsonObject e;
      e.add("codec", cases[i].label).add("elements", static_cast<int64_t>(n));
      e.add("payload_bytes", static_cast<int64_t>(cases[i].payload.size()));
      e.add("compression_ratio", 4.0 * static_cast<double>(n) / std::max<size_t>(1, cases[i].payload.size()));
      e.add("encode_GBps", enc).add("decode_GBps", dec);
      e.add("encode_of_memcpy", enc / memcpy_gbps).add("decode_vs_dense_add", dec / add_gbps);
      e.add("memcpy_GBps", memcpy_gbps).add("dense_add_GBps", add_gbps);
      emit("codec", cases[i].label + " n=" + human(n), "encode_GBps", enc, "GB/s", &e);
    }
  }
  return 0;
}

}  // namespace hearsay::bench

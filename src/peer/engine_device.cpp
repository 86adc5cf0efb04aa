// GossipEngine's gossip on a CUDA device (gossip_on_device): device snapshots, encoding on the
// device for the wire, and decoding arrivals into device memory.

#include <algorithm>
#include <limits>
#include <cmath>

#include "algorithm.h"
#include "hearsay/build_config.h"
#include "hearsay/device_codec.h"
#include "hearsay/error.h"
#include "mailboxes.h"
#include "engine_device.h"
#include "segment_frames.h"
#include "update_guard.h"
#include "../mixer/robust.h"

namespace hearsay {

// --- Gossip on the device (gossip_on_device) ------------------------------------------
// Everything below that touches CUDA memory is built only with CUDA; a peer gossips on
// its device only in such a build (gossip_device), so the stubs are never reached.

void GossipEngine::say_once(const std::string& what) {
  std::lock_guard<std::mutex> lock(said_mu_);
  if (std::find(said_.begin(), said_.end(), what) != said_.end()) return;
  said_.push_back(what);
  std::fprintf(stderr, "hearsay: peer %s: %s\n", peers_[me_].c_str(), what.c_str());
}

#if HEARSAY_HAVE_CUDA
namespace {

// A snapshot in memory of the peer's backend. The copy runs on the backend's stream and is
// waited for, because the device codecs read it from other threads on another stream.
class BackendSnapshot final : public GossipEngine::DeviceSnapshot {
 public:
  BackendSnapshot(Backend& backend, int device, const float* src, size_t n)
      : backend_(backend), device_(device), buffer_(backend, sizeof(float) * n), n_(n) {
    backend_.copy(buffer_.data(), src, sizeof(float) * n);
    backend_.synchronize();
  }
  size_t size() const override { return n_; }
  const float* data() const override { return buffer_.f32(); }
  std::shared_ptr<const std::vector<float>> host() const override {
    std::call_once(downloaded_, [this] {
      auto h = std::make_shared<std::vector<float>>(n_);
      use_cuda_device(device_);  // a transport thread's current device may be another
      device_to_host(h->data(), buffer_.data(), sizeof(float) * n_);
      host_ = std::move(h);
    });
    return host_;
  }
  std::shared_ptr<const DeviceSnapshot> combine(float a, const DeviceSnapshot& other, float b) const override {
    auto out = std::make_shared<BackendSnapshot>(backend_, device_, data(), n_);
    if (a != 1.0f) backend_.scale(n_, a, out->buffer_.f32());
    backend_.axpy(n_, b, other.data(), out->buffer_.f32());
    backend_.synchronize();
    return out;
  }

 private:
  Backend& backend_;
  int device_;
  DeviceBuffer buffer_;
  size_t n_;
  mutable std::once_flag downloaded_;
  mutable std::shared_ptr<const std::vector<float>> host_;  // set once, under downloaded_
};

bool same_codec(const CodecSpec& a, const CodecSpec& b) {
  return a.name == b.name && a.density == b.density && a.exact_topk == b.exact_topk && a.value_bits == b.value_bits &&
         a.levels == b.levels && a.block == b.block && a.rank == b.rank && a.error_feedback == b.error_feedback;
}

}  // namespace

std::vector<float> owed_residual(const LinkEncoder& enc, const DeviceLinkEncoder& twin) {
  std::vector<float> owed = twin.residual_host();
  const auto& host = enc.residual();
  if (owed.empty()) return host;
  for (size_t k = 0; k < host.size() && k < owed.size(); ++k) owed[k] += host[k];
  return owed;
}

std::shared_ptr<const GossipEngine::DeviceSnapshot> GossipEngine::snapshot_device(const float* src, size_t n) {
  HEARSAY_CHECK(on_device_, "snapshot_device on a peer that gossips on the host");
  return std::make_shared<BackendSnapshot>(model_.backend(), cuda_device_, src, n);
}

bool GossipEngine::put_device_on_wire(int i, Message& m, const std::function<void(const SendStatus&)>& done) {
  const size_t n = m.device->size();
  LinkCodecs& lc = *link_codecs_[i];
  std::unique_lock<std::mutex> codec_lock(lc.mu);  // one message per link at a time anyway
  const bool push_sum = m.kind == MessageKind::kPushSum && !m.synchronous;
  bool update = false;
  LinkEncoder* enc = link_encoder(i, m, n, &update);
  if (push_sum && enc != nullptr) {
    codec_lock.unlock();
    say_once("push-sum shares under a lossy codec are encoded on the host: the rounding the codec takes off a share is "
             "given back to this peer as a host vector");
    return false;
  }
  DeviceLinkEncoder* twin = nullptr;
  if (enc != nullptr) {
    auto& slot = update ? lc.device_update : lc.device_model;
    try {
      if (!slot) {
        slot = std::make_shared<DeviceLinkEncoder>(cuda_device_, enc->spec(), model_.param_views(), lc.seed);
      } else if (!same_codec(slot->spec(), enc->spec())) {
        slot->set_spec(enc->spec());  // the host encoder's choice (adaptive): the twin follows
      }
    } catch (const InputError& e) {
      slot.reset();
      const std::string name = enc->spec().name;
      codec_lock.unlock();
      say_once("codec '" + name + "' has no device twin (" + e.what() + "): its messages are encoded on the host");
      return false;
    }
    twin = slot.get();
    // What the host encoder still owes (a fallback's sends, a checkpoint's residual) moves
    // to the device once, so the two never both hold what one link owes for long.
    if (twin->error_feedback() && !enc->residual().empty()) {
      twin->add_to_residual(enc->residual(), enc->residual().size());
      enc->residual().clear();
    }
  }
  const auto segs = enc != nullptr ? enc->codec().segments(n, spec_.segment_elements) : even_segments(n, spec_.segment_elements);
  SegmentFrames out(m, peers_[me_], next_update_id_++, segs.size());
  std::shared_ptr<const std::vector<float>> raw;  // the dense values, downloaded once, where no codec applies
  for (uint32_t s = 0; s < segs.size(); ++s) {
    const auto [begin, len] = segs[s];
    wire::Update& u = out.segment(s, m.offset + begin, len);
    if (twin == nullptr) {
      if (!raw) raw = m.device->host();
      out.add(reinterpret_cast<const uint8_t*>(raw->data() + begin), len * sizeof(float), raw);
    } else {
      auto payload = std::make_shared<std::vector<uint8_t>>();
      CodecParams params;
      twin->encode(m.device->data() + begin, len, m.offset + begin, m.total, *payload, params);
      write_codec_params(params, u.mutable_codec());
      out.add(payload->data(), payload->size(), payload);
    }
  }
  codec_lock.unlock();
  // A push (raw here) whose send fails is given back whole, as on the host path.
  sent_by_kind_[static_cast<size_t>(m.kind)] += out.bytes;
  send_frames(i, std::move(out.frames), out.bytes, done, push_sum ? raw : nullptr, m.push_sum_weight, m.offset);
  return true;
}

bool GossipEngine::decode_on_device(const Message& m, double a, float* device_dst) {
  if (!on_device_ || !m.payloads) return false;
  // The backend's stream is not ordered with the codecs' (the default stream): what it
  // has queued on the destination finishes first; the decode waits for itself.
  model_.backend().synchronize();
  use_cuda_device(cuda_device_);
  for (const auto& s : m.payloads->segments) {
    const std::string err = device_decode_accumulate(s.params, s.payload->data(), s.payload->size(), static_cast<float>(a),
                                                     device_dst + s.offset, s.length);
    // The inbox decoded these very bytes on the host and checked them before keeping them.
    HEARSAY_CHECK(err.empty(), "an update that decoded on the host does not decode on the device: " + err);
  }
  return true;
}

void GossipEngine::note_own_gradient(const DeviceSnapshot& g) {
  use_cuda_device(cuda_device_);
  const double n = std::sqrt(device_sum_squares(g.data(), g.size())), old = own_grad_norm_.load();
  own_grad_norm_ = old <= 0 ? n : 0.9 * old + 0.1 * n;
}

#else  // no CUDA: no peer gossips on a device (gossip_device is -1), so none of this is reached

std::shared_ptr<const GossipEngine::DeviceSnapshot> GossipEngine::snapshot_device(const float*, size_t) {
  HEARSAY_CHECK(false, "snapshot_device in a build without CUDA");
  return nullptr;
}
bool GossipEngine::put_device_on_wire(int, Message&, const std::function<void(const SendStatus&)>&) { return false; }
bool GossipEngine::decode_on_device(const Message&, double, float*) { return false; }
void GossipEngine::note_own_gradient(const DeviceSnapshot&) {
  HEARSAY_CHECK(false, "note_own_gradient(DeviceSnapshot) in a build without CUDA");
}

#endif

void GossipEngine::send_device(int to, Message m, std::shared_ptr<const DeviceSnapshot> data) {
  if (spec_.byzantine != "none" && !m.synchronous) {
    say_once("fault injection (byzantine '" + spec_.byzantine + "') lies on the host: this peer's sends are encoded there");
    return send(to, std::move(m), std::vector<float>(*data->host()));
  }
  stamp(m);
  m.device = std::move(data);
  offer(to, std::move(m));
}

void GossipEngine::axpy_params(double a, const Message& m) {
  if (!decode_on_device(m, a, model_.params())) axpy_host(a, m, model_.params());
}

void GossipEngine::axpy_grads(double a, const Message& m) {
  if (!decode_on_device(m, a, model_.grads())) axpy_host(a, m, model_.grads());
}

void GossipEngine::mix_neighbour_model(int from, const Message& m, double w) {
  // A robust rule needs the host values (its target is computed there).
  if (!on_device_ || !m.payloads || spec_.mixer.robust != MixerSpec::Robust::kNone) return mix_host(from, m, w);
  // x <- (1 - w) x + w y, as mix_params does it: scale, then add w y.
  model_.backend().scale(m.data.size(), static_cast<float>(1.0 - w), model_.params());
  decode_on_device(m, w, model_.params());
}

}  // namespace hearsay

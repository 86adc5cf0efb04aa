#include "link_table.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

namespace hearsay {

void LinkTable::set_receiver(Transport::Receiver r) {
  std::vector<std::pair<std::string, InFrame>> early;
  Transport::Receiver now;
  std::shared_ptr<CallbackGate> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    receiver_ = std::move(r);
    now = receiver_;
    // Calls of the replaced receiver go through its own gate, closed below.
    old = std::exchange(gate_, std::make_shared<CallbackGate>());
    if (now) {
      early.swap(early_);
      early_bytes_ = 0;
    }
  }
  old->close();
  // Frames that arrived before anyone listened (a neighbour that started first), in order.
  for (auto& [peer, frame] : early) now(peer, std::move(frame));
}
void LinkTable::set_listener(Transport::LinkListener l) { listener_ = std::move(l); }

void LinkTable::count(const std::string& reason) {
  // Count by the reason's kind (text before the first ':'), so counters stay few.
  const std::string key = reason.substr(0, reason.find(':'));
  ++counters_.rejected[key];
}

void LinkTable::admitted(const std::string& peer, const std::shared_ptr<Connection>& c, const std::string& address) {
  // One live connection per peer: a newer one has proved itself (admission), so it takes
  // the name and the older one goes (a peer that restarted before its old link timed out).
  std::vector<std::shared_ptr<Connection>> replaced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& l : links_) {
      if (l.first == peer) replaced.push_back(l.second);
    }
    links_.emplace_back(peer, c);
    ++counters_.connections_admitted;
    counters_.connections_replaced += replaced.size();
  }
  for (const auto& old : replaced) {
    std::fprintf(stderr, "hearsay: %s: peer %s admitted again from %s; its older connection is closed\n", name_.c_str(),
                 peer.c_str(), address.c_str());
    old->displace("replaced by a newer admitted connection from " + address);
  }
  if (listener_) listener_({LinkEvent::Kind::kUp, peer, address, ""});
}

void LinkTable::closed(const std::string& peer, const Connection* c, const std::string& address, const std::string& reason) {
  bool was_admitted = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(links_.begin(), links_.end(), [&](const auto& l) { return l.second.get() == c; });
    if (it != links_.end()) {
      // Keep what the connection carried, so a peer's totals survive reconnects.
      const LinkStats s = c->stats();
      LinkStats& r = retired_[peer];
      r.bytes_sent += s.bytes_sent;
      r.bytes_received += s.bytes_received;
      r.frames_sent += s.frames_sent;
      r.frames_received += s.frames_received;
      links_.erase(it);
      was_admitted = true;
    }
  }
  if (was_admitted && listener_) listener_({LinkEvent::Kind::kDown, peer, address, reason});
}

void LinkTable::rejected(const std::string& peer, const std::string& address, const std::string& reason) {
  uint64_t times = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    count(reason);
    // Said once per host, peer and reason, then again at 10, 100, 1000... times with the
    // count: a neighbour with another secret redials for as long as the join waits, and a
    // line a dial would bury the one message that matters. The host without its port (an
    // accepted connection's port differs each time); a bounded table, past which every
    // rejection is said (strangers choose their hosts).
    const std::string key = address.substr(0, address.rfind(':')) + '\n' + peer + '\n' + reason;
    const auto it = said_.find(key);
    if (it != said_.end()) {
      times = ++it->second;
    } else if (said_.size() < kMaxSaid) {
      times = said_[key] = 1;
    }
  }
  const bool say = times <= 1 || times == 10 || times == 100 || times == 1000 || times % 10000 == 0;
  if (say) {
    const std::string again = times > 1 ? " (the same " + std::to_string(times) + " times now)" : "";
    std::fprintf(stderr, "hearsay: %s: closed connection %s%s%s: %s%s\n", name_.c_str(), address.c_str(),
                 peer.empty() ? "" : " of peer ", peer.c_str(), reason.c_str(), again.c_str());
  }
  if (listener_) listener_({LinkEvent::Kind::kRejected, peer, address, reason});
}

void LinkTable::unreachable(const std::string& peer, const std::string& address, const std::string& reason) {
  if (listener_) listener_({LinkEvent::Kind::kUnreachable, peer, address, reason});
}

void LinkTable::dropped(const std::string& peer, const std::string& address, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    count(reason);
  }
  std::fprintf(stderr, "hearsay: %s: dropped a frame from %s (%s): %s\n", name_.c_str(), peer.c_str(), address.c_str(),
               reason.c_str());
}

void LinkTable::deliver(const std::string& peer, InFrame&& frame) {
  for (;;) {
    Transport::Receiver r;
    std::shared_ptr<CallbackGate> gate;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!receiver_) {
        // Held, boundedly, until a receiver is set: a peer still loading its data must not
        // lose the first round of a synchronous algorithm.
        early_bytes_ += frame.payload.size();
        early_.emplace_back(peer, std::move(frame));
        while (early_.size() > kMaxEarlyFrames || early_bytes_ > kMaxEarlyBytes) {
          early_bytes_ -= early_.front().second.payload.size();
          early_.erase(early_.begin());
          count("early_overflow");
        }
        return;
      }
      r = receiver_;
      gate = gate_;
    }
    const CallbackGate::Pass pass(*gate);
    if (pass) return r(peer, std::move(frame));
    // The receiver was replaced meanwhile: the frame goes to the one now set.
  }
}

std::shared_ptr<Connection> LinkTable::find(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = links_.rbegin(); it != links_.rend(); ++it) {
    if (it->first == peer) return it->second;
  }
  return nullptr;
}

std::vector<std::string> LinkTable::peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> s;
  for (const auto& l : links_) s.insert(l.first);
  return {s.begin(), s.end()};
}

LinkStats LinkTable::stats(const std::string& peer) const {
  const auto c = find(peer);
  LinkStats s = c ? c->stats() : LinkStats{};
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = retired_.find(peer);
  if (it != retired_.end()) {
    s.bytes_sent += it->second.bytes_sent;
    s.bytes_received += it->second.bytes_received;
    s.frames_sent += it->second.frames_sent;
    s.frames_received += it->second.frames_received;
  }
  return s;
}

TransportCounters LinkTable::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

std::vector<std::shared_ptr<Connection>> LinkTable::take_all() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Connection>> out;
  for (auto& l : links_) out.push_back(std::move(l.second));
  links_.clear();
  return out;
}

}  // namespace hearsay

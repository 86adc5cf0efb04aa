// hearsay._engine: the engine under a Python training loop (docs/PYTORCH.md). It knows
// nothing of torch: hearsay.torch (python/hearsay/torch.py) lays the model's parameters
// and gradients out in flat tensors and hands their addresses here, with a callable that
// runs the torch optimizer. Engine work runs with the GIL released; the optimizer callback
// takes it back on the same thread.
//
// Threads: one Python thread drives a peer. Every call that reaches the engine's state
// claims the peer for its thread first (PyPeer::Claim): a second thread's call while one
// runs (a step waiting for a round with the GIL released) raises InputError instead of
// racing it. The same thread may call again from inside (the optimizer callback); stop()
// and close() stay callable from anywhere (signals, exit).
#include <malloc.h>
#include <poll.h>
#include <csignal>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "hearsay/build_config.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/external_peer.h"
#include "hearsay/gossip.h"
#include "hearsay/launcher.h"
#include "hearsay/log.h"
#include "hearsay/model.h"
#include "hearsay/process.h"
#include "hearsay/wire.h"

namespace py = pybind11;

namespace {

py::array_t<float> to_array(const std::vector<float>& v);

// A Python exception raised inside the optimizer callback crosses the engine as this, and
// is raised again, as itself, once the step has returned to Python.
struct PythonRaised : std::runtime_error {
  PythonRaised() : std::runtime_error("the optimizer step raised a Python exception") {}
};

// The most samples one batch call returns (an argument from Python, bounded before it
// sizes an allocation).
constexpr int kMaxBatch = 1 << 20;

class PyPeer {
 public:
  // Holds the peer for the calling thread while one call runs; throws InputError naming
  // both calls and threads when another thread holds it.
  class Claim {
   public:
    Claim(PyPeer& p, const char* what) : p_(p) {
      const unsigned long me = PyThread_get_thread_ident();
      unsigned long holder = 0;
      if (p_.holder_.compare_exchange_strong(holder, me)) {
        p_.held_for_ = what;
        owned_ = true;
        return;
      }
      if (holder == me) return;  // the same thread, from inside its own call (the optimizer callback)
      throw hearsay::InputError("hearsay peer '" + p_.name_ + "': " + what + " called on thread " + std::to_string(me) + " while " +
                                p_.held_for_.load() + " runs on thread " + std::to_string(holder) +
                                "; one thread drives a peer (steps, batches, state)");
    }
    ~Claim() {
      if (owned_) p_.holder_ = 0;
    }
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;

   private:
    PyPeer& p_;
    bool owned_ = false;
  };

  // `signal_fd` (>= 0: Python's wakeup fd, signal.set_wakeup_fd) is watched from before
  // the peer is made, so that SIGTERM or SIGINT while it joins ends the join at once.
  PyPeer(const std::string& config, const std::string& name, const std::string& log, const std::vector<std::string>& sets,
         bool quiet, bool alone, int signal_fd, const std::string& metrics) {
    hearsay::ExternalPeerOptions o;
    o.config_path = config;
    o.name = name;
    o.log_path = log;
    o.sets = sets;
    o.quiet = quiet;
    o.alone = alone;
    o.stop = &stop_requested_;
    o.metrics_address = metrics;
    if (signal_fd >= 0) watch_signals(signal_fd);
    try {
      py::gil_scoped_release release;  // joining a cluster waits for the neighbours
      auto made = std::make_unique<hearsay::ExternalPeer>(o);
      std::lock_guard<std::mutex> lock(peer_mu_);
      peer_ = std::move(made);
    } catch (...) {
      stop_watch();
      throw;
    }
    name_ = peer_->name();
  }
  ~PyPeer() {
    stop_watch();
    py::gil_scoped_release release;  // the engine's threads end here; none of them needs the GIL
    peer_.reset();
  }

  void attach(uintptr_t params, uintptr_t grads, size_t n, const std::vector<py::tuple>& views, const std::string& device,
              const std::string& description, py::function optimizer_step, bool join, uintptr_t buffers, size_t num_buffers,
              const std::string& buffer_sharing) {
    const Claim claim(*this, "attach()");
    hearsay::ExternalModel m;
    if (num_buffers > 0) {
      if (buffer_sharing != "average" && buffer_sharing != "broadcast") {
        throw hearsay::InputError("attach: buffer sharing '" + buffer_sharing + "' (average or broadcast)");
      }
      m.buffers = reinterpret_cast<float*>(buffers);
      m.num_buffers = num_buffers;
      m.buffer_sharing = buffer_sharing == "average" ? hearsay::ExternalModel::BufferSharing::kAverage
                                                     : hearsay::ExternalModel::BufferSharing::kBroadcast;
    }
    m.params = reinterpret_cast<float*>(params);
    m.grads = reinterpret_cast<float*>(grads);
    m.num_params = n;
    m.device = device;
    m.description = description;
    for (const py::tuple& t : views) {
      try {
        if (t.size() != 4) throw py::cast_error();
        m.views.push_back({t[0].cast<std::string>(), t[1].cast<size_t>(), t[2].cast<size_t>(), t[3].cast<std::vector<int>>()});
      } catch (const py::cast_error&) {
        throw hearsay::InputError("attach: view " + std::to_string(m.views.size()) + " is not (name, offset, size, [dims])");
      }
    }
    optimizer_step_ = std::move(optimizer_step);
    m.optimizer_step = [this](float lr) {
      py::gil_scoped_acquire gil;
      try {
        optimizer_step_(lr);
      } catch (py::error_already_set& e) {
        raised_.emplace(std::move(e));
        throw PythonRaised();
      }
    };
    py::gil_scoped_release release;
    peer_->attach(std::move(m), join);
  }

  void step(double loss_sum, int64_t correct, int64_t count, float lr) {
    const Claim claim(*this, "step()");
    try {
      py::gil_scoped_release release;
      peer_->step({loss_sum, correct, count}, lr);
    } catch (const PythonRaised&) {
      py::error_already_set e = std::move(*raised_);
      raised_.reset();
      throw e;
    }
  }

  // The next minibatch of the shard: (x float32 [b, dim] or int32 [b, context], y int32).
  py::tuple next_batch(int batch) {
    const Claim claim(*this, "next_batch()");
    const auto& train = peer_->data().train;
    // Checked before anything is allocated for it.
    if (batch < 1 || batch > kMaxBatch) {
      throw hearsay::InputError("next_batch: a batch of " + std::to_string(batch) + " samples (1 to " +
                                std::to_string(kMaxBatch) + ")");
    }
    if (train.is_text()) {
      py::array_t<int32_t> x({batch, train.context}), y({batch, train.context});
      peer_->next_batch(batch, nullptr, x.mutable_data(), y.mutable_data());
      return py::make_tuple(x, y);
    }
    py::array_t<float> x({batch, train.dim()});
    py::array_t<int32_t> y(batch);
    peer_->next_batch(batch, x.mutable_data(), nullptr, y.mutable_data());
    return py::make_tuple(x, y);
  }

  // Test samples [start, start + n) (fewer at the end), as next_batch shapes them.
  py::tuple test_batch(int64_t start, int n) {
    const Claim claim(*this, "test_batch()");
    const auto& test = peer_->data().test;
    if (start < 0 || start >= test.size || n < 1 || n > kMaxBatch) {
      throw hearsay::InputError("test_batch: start " + std::to_string(start) + " is outside the " + std::to_string(test.size) +
                                " test samples");
    }
    n = static_cast<int>(std::min<int64_t>(n, test.size - start));
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) idx[i] = start + i;
    if (test.is_text()) {
      py::array_t<int32_t> x({n, test.context}), y({n, test.context});
      hearsay::gather_tokens(test, idx.data(), n, x.mutable_data(), y.mutable_data());
      return py::make_tuple(x, y);
    }
    py::array_t<float> x({n, test.dim()});
    py::array_t<int32_t> y(n);
    hearsay::gather_batch(test, idx.data(), n, x.mutable_data(), y.mutable_data());
    return py::make_tuple(x, y);
  }

  py::bytes save_state() {
    const Claim claim(*this, "state_dict()");
    return py::bytes(peer_->save_state());
  }
  void load_state(const py::bytes& b) {
    const Claim claim(*this, "load_state_dict()");
    peer_->load_state(std::string(b));
  }
  void follow_data(int64_t batches_per_epoch, int64_t batches_per_step) {
    const Claim claim(*this, "batches()");
    peer_->follow_data(batches_per_epoch, batches_per_step);
  }
  void fed_batch() {
    const Claim claim(*this, "batches()");
    peer_->fed_batch();
  }
  void params_written() {
    const Claim claim(*this, "load_state_dict()");
    py::gil_scoped_release release;  // waits for the engine's copy between steps
    peer_->params_written();
  }
  void record_eval(double acc, double loss) {
    const Claim claim(*this, "log_eval()");
    peer_->record_eval(acc, loss);
  }
  void finish() {
    const Claim claim(*this, "finish()");
    py::gil_scoped_release release;
    peer_->finish();
  }
  void final_consensus() {
    const Claim claim(*this, "finish()");
    py::gil_scoped_release release;  // waits for the others to finish
    peer_->final_consensus();
  }
  // The script's all_reduce over n floats at `values` (a contiguous float32 CPU tensor's
  // memory, which the Python side keeps alive), in place.
  void all_reduce(uintptr_t values, size_t n, const std::string& op) {
    const Claim claim(*this, "all_reduce()");
    using Op = hearsay::ExternalPeer::ReduceOp;
    const Op o = op == "sum" ? Op::kSum : op == "mean" ? Op::kMean : op == "max" ? Op::kMax : op == "min" ? Op::kMin : [&]() -> Op {
      throw hearsay::InputError("all_reduce(): op '" + op + "'; use sum, mean, max or min");
    }();
    py::gil_scoped_release release;
    peer_->all_reduce(reinterpret_cast<float*>(values), n, o);
  }
  void barrier() {
    const Claim claim(*this, "barrier()");
    py::gil_scoped_release release;
    peer_->barrier();
  }

  // An event from Python: `fields` (str -> bool, int, float, str, list of str or dict of
  // str -> number) after
  // the common ones. Checked against the log's schema.
  void log_event(const std::string& name, const py::dict& fields) {
    const Claim claim(*this, "log()");
    hearsay::JsonObject e = peer_->log().event(name);
    for (const auto& [key, value] : fields) {
      const std::string k = py::str(key);
      if (k == "t" || k == "peer" || k == "event") throw hearsay::InputError("log(): field '" + k + "' is the log's own");
      if (py::isinstance<py::bool_>(value)) {
        e.add(k, value.cast<bool>());
      } else if (py::isinstance<py::int_>(value)) {
        e.add(k, value.cast<int64_t>());
      } else if (py::isinstance<py::float_>(value)) {
        e.add(k, value.cast<double>());
      } else if (py::isinstance<py::str>(value)) {
        e.add(k, value.cast<std::string>());
      } else if (value.is_none()) {
        e.add_null(k);
      } else if (py::isinstance<py::list>(value)) {
        e.add(k, value.cast<std::vector<std::string>>());
      } else if (py::isinstance<py::dict>(value)) {
        // Numbers by name (a metrics event's values): the schema checks what they may be.
        hearsay::JsonObject members;
        for (const auto& [name, number] : value.cast<py::dict>()) {
          const std::string n = py::str(name);
          if (!py::isinstance<py::float_>(number) && !py::isinstance<py::int_>(number)) {
            throw hearsay::InputError("log(): field '" + k + "' member '" + n + "' is a " +
                                      std::string(py::str(number.get_type().attr("__name__"))) + "; give numbers");
          }
          members.add(n, number.cast<double>());
        }
        e.add(k, members);
      } else {
        throw hearsay::InputError("log(): field '" + k + "' is a " + std::string(py::str(value.get_type().attr("__name__"))) +
                                  "; give a bool, int, float, str, None, list of str or dict of str to number");
      }
    }
    peer_->write_event(e);
  }

  // Signals: Python's handlers run only between bytecodes, never while a step waits for a
  // synchronous round. Its wakeup file descriptor (signal.set_wakeup_fd) is written in the
  // signal itself: a thread here reads it and stops the peer, so the wait ends.
  void watch_signals(int fd) {
    stop_watch();
    watching_ = true;
    watcher_ = std::thread([this, fd] {
      while (watching_) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) > 0 && (p.revents & POLLIN)) {
          // Python writes each signal's number: only SIGTERM and SIGINT end the run (a
          // DataLoader's SIGCHLD must not).
          unsigned char buf[64];
          const ssize_t n = ::read(fd, buf, sizeof buf);
          for (ssize_t i = 0; i < n; ++i) {
            if (buf[i] != SIGTERM && buf[i] != SIGINT) continue;
            int none = 0;
            stop_signal_.compare_exchange_strong(none, buf[i]);  // the first one is what stopped it
            stop_requested_ = true;  // a join under way ends
            std::lock_guard<std::mutex> lock(peer_mu_);
            if (peer_) peer_->stop();
          }
        }
      }
    });
  }
  int stop_signal() const { return stop_signal_; }
  void stop_watch() {
    watching_ = false;
    if (watcher_.joinable()) watcher_.join();
  }

  // The config's native model as hearsay-peer would start it (model, seed): [(name,
  // array)] in its order, each array shaped as the view. A torch copy of the same network
  // can start from it, so that the two train the same weights.
  py::list native_initial_params() const {
    auto backend = hearsay::create_backend("cpu", 1);
    auto model = hearsay::create_model(peer_->spec().model, *backend, 1, peer_->spec().seed);
    const std::vector<float> all = model->get_params();
    py::list out;
    for (const auto& v : model->param_views()) {
      std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end());
      py::array_t<float> a(shape);
      std::copy(all.begin() + static_cast<std::ptrdiff_t>(v.offset), all.begin() + static_cast<std::ptrdiff_t>(v.offset + v.size),
                a.mutable_data());
      out.append(py::make_tuple(v.name, a));
    }
    return out;
  }

  // What the engine reads at the parameter and gradient addresses it was given (host
  // copies through the backend), and a write of the parameters through it: tests of the
  // shared buffers.
  py::array_t<float> engine_params() {
    const Claim claim(*this, "engine_params()");
    return to_array(peer_->engine_params());
  }
  py::array_t<float> engine_grads() {
    const Claim claim(*this, "engine_grads()");
    return to_array(peer_->engine_grads());
  }
  void engine_write_params(const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
    const Claim claim(*this, "engine_write_params()");
    peer_->engine_write_params(std::vector<float>(a.data(), a.data() + a.size()));
  }

  hearsay::ExternalPeer& peer() { return *peer_; }

 private:
  std::unique_ptr<hearsay::ExternalPeer> peer_;
  std::string name_;
  std::atomic<unsigned long> holder_{0};       // the thread holding the peer (Claim), 0: none
  std::atomic<const char*> held_for_{"a call"};  // what it runs
  py::function optimizer_step_;
  std::optional<py::error_already_set> raised_;
  std::atomic<bool> watching_{false};
  std::thread watcher_;
  std::atomic<bool> stop_requested_{false};  // a signal came (the join's stop flag)
  std::atomic<int> stop_signal_{0};          // which: SIGTERM or SIGINT; 0 none
  std::mutex peer_mu_;                       // peer_ as the watcher sees it while it is made
};

py::array_t<float> to_array(const std::vector<float>& v) {
  py::array_t<float> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::dict model_dict(const hearsay::ModelSpec& m) {
  static const char* kinds[] = {"LOGREG", "MLP", "CNN", "GPT"};
  py::dict d;
  d["kind"] = kinds[static_cast<int>(m.kind)];
  d["input_shape"] = py::make_tuple(m.height, m.width, m.channels);
  d["num_classes"] = m.num_classes;
  d["hidden"] = m.hidden;
  d["conv_channels"] = m.conv_channels;
  d["kernel"] = m.kernel;
  d["fc_width"] = m.fc_width;
  py::dict g;
  g["vocab"] = m.gpt.vocab;
  g["context"] = m.gpt.context;
  g["layers"] = m.gpt.layers;
  g["heads"] = m.gpt.heads;
  g["width"] = m.gpt.width;
  d["gpt"] = g;
  return d;
}

py::dict optim_dict(const hearsay::OptimizerSpec& o, const hearsay::LrSchedule& s) {
  py::dict d;
  d["optimizer"] = o.name;
  d["lr"] = s.base_lr;
  d["momentum"] = o.momentum;
  d["nesterov"] = o.nesterov;
  d["weight_decay"] = o.weight_decay;
  d["betas"] = py::make_tuple(o.beta1, o.beta2);
  d["eps"] = o.eps;
  d["grad_clip_norm"] = o.grad_clip_norm;
  return d;
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "hearsay's engine for Python training loops; use hearsay.torch";
  // The engine hands whole models around: a 10M-parameter model is a 40 MB vector several
  // times per exchange. glibc serves blocks above its mmap threshold (32 MB at most) with
  // fresh mappings that the kernel zeroes on first touch, 30 ms each here, which was most
  // of the engine's time per step on such a model (docs/BENCHMARKS.md, "The engine's
  // overhead per step"). Blocks up to 512 MB come from the heap instead, and freed memory
  // stays with the process (up to its peak) for the next one.
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  m.attr("__version__") = HEARSAY_VERSION;
  m.attr("with_cuda") = HEARSAY_HAVE_CUDA != 0;
  static py::exception<hearsay::InputError> input_error(m, "InputError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const hearsay::InputError& e) {
      input_error(e.what());
    }
  });
  m.def("algorithms", &hearsay::gossip_algorithms, "the registered gossip algorithms");
  m.def(
      "crc32c", [](const py::bytes& data) {
        const std::string_view v = data;
        return hearsay::crc32c(v.data(), v.size());
      },
      "CRC32C (Castagnoli) of the bytes: the engine's own, for the formats written in Python (TensorBoard's records)");
  m.def("set_program_name", &hearsay::set_program_name,
        "the name the engine's messages on stderr begin with (the script's, not hearsay-peer)");
  // The config's cluster (after the --set fragments): its peers' names in order (empty
  // without a cluster) and its algorithm, for hearsay.torch.init to name this process's
  // peer from a launcher's rank before the peer joins.
  m.def(
      "cluster_of",
      [](const std::string& config, const std::vector<std::string>& sets) {
        const hearsay::config::Config cfg = hearsay::load_config_file(config, sets);
        std::vector<std::string> names;
        for (const auto& p : cfg.cluster().peers()) names.push_back(p.name());
        return py::make_tuple(names, cfg.cluster().gossip().algorithm());
      },
      py::arg("config"), py::arg("sets") = std::vector<std::string>{});

  // The launcher's resolution of include/hearsay/launcher.h (the one hearsay-peer uses):
  // (name, launcher, local_rank) of `peers` from `env`, or None where no launcher said.
  m.def(
      "peer_from_launcher",
      [](const std::map<std::string, std::string>& env, const std::vector<std::string>& peers,
         const std::string& config) -> py::object {
        const auto found = hearsay::peer_from_launcher(
            [&env](const std::string& var) -> std::optional<std::string> {
              const auto it = env.find(var);
              if (it == env.end()) return std::nullopt;
              return it->second;
            },
            peers, config);
        if (!found) return py::none();
        return py::make_tuple(found->name, found->launcher, found->local_rank);
      },
      py::arg("env"), py::arg("peers"), py::arg("config"));

  py::class_<PyPeer>(m, "Peer")
      .def(py::init<const std::string&, const std::string&, const std::string&, const std::vector<std::string>&, bool, bool, int,
                    const std::string&>(),
           py::arg("config"), py::arg("name") = "", py::arg("log") = "", py::arg("sets") = std::vector<std::string>{},
           py::arg("quiet") = false, py::arg("alone") = false, py::arg("signal_fd") = -1, py::arg("metrics") = "")
      .def_property_readonly("metrics_port", [](PyPeer& p) { return p.peer().metrics_port(); },
                             "the port its metrics are served at (--metrics); 0 without")
      .def_property_readonly("stop_signal", [](const PyPeer& p) { return p.stop_signal(); },
                             "the signal (SIGTERM, SIGINT) that stopped the run; 0 if none")
      .def("attach", &PyPeer::attach, py::arg("params"), py::arg("grads"), py::arg("n"), py::arg("views"), py::arg("device"),
           py::arg("description"), py::arg("optimizer_step"), py::arg("join") = true, py::arg("buffers") = 0,
           py::arg("num_buffers") = 0, py::arg("buffer_sharing") = "broadcast")
      .def("follow_data", &PyPeer::follow_data, py::arg("batches_per_epoch"), py::arg("batches_per_step"))
      .def("fed_batch", &PyPeer::fed_batch)
      .def("params_written", &PyPeer::params_written)
      .def("step", &PyPeer::step, py::arg("loss_sum"), py::arg("correct"), py::arg("count"), py::arg("lr"))
      .def("next_batch", &PyPeer::next_batch, py::arg("batch"))
      .def("test_batch", &PyPeer::test_batch, py::arg("start"), py::arg("n"))
      .def("save_state", &PyPeer::save_state)
      .def("load_state", &PyPeer::load_state)
      .def("log_event", &PyPeer::log_event)
      .def("watch_signals", &PyPeer::watch_signals)
      .def("native_initial_params", &PyPeer::native_initial_params)
      .def("engine_params", &PyPeer::engine_params)
      .def("engine_grads", &PyPeer::engine_grads)
      .def("engine_write_params", &PyPeer::engine_write_params)
      .def_property_readonly("engine_params_address",
                             [](PyPeer& p) { return reinterpret_cast<uintptr_t>(p.peer().engine_params_address()); })
      .def("record_eval", &PyPeer::record_eval)
      .def("finish", &PyPeer::finish)
      .def("final_consensus", &PyPeer::final_consensus)
      .def("all_reduce", &PyPeer::all_reduce, py::arg("values"), py::arg("n"), py::arg("op"))
      .def("barrier", &PyPeer::barrier)
      // Every thread this module started ends here: close() also runs at interpreter exit
      // (atexit), when the PyPeer itself may never be destroyed, and a watcher still
      // polling while the exit handlers tear the process down is a crash at exit.
      .def("close", [](PyPeer& p) { p.stop_watch(); p.peer().close(); }, py::call_guard<py::gil_scoped_release>())
      .def("synchronize", [](PyPeer& p) { p.peer().synchronize(); }, py::call_guard<py::gil_scoped_release>())
      .def("stop", [](PyPeer& p) { p.peer().stop(); })
      .def("scheduled_lr", [](PyPeer& p) { return p.peer().scheduled_lr(); })
      .def_property_readonly("running", [](PyPeer& p) { return p.peer().running(); })
      .def_property_readonly("eval_due", [](PyPeer& p) { return p.peer().eval_due(); })
      .def_property_readonly("attached", [](PyPeer& p) { return p.peer().attached(); })
      .def_property_readonly("name", [](PyPeer& p) { return p.peer().name(); })
      .def_property_readonly("rank", [](PyPeer& p) { return p.peer().rank(); })
      .def_property_readonly("peers", [](PyPeer& p) { return p.peer().peers(); })
      .def_property_readonly("algorithm", [](PyPeer& p) { return p.peer().algorithm(); })
      .def_property_readonly("synchronous", [](PyPeer& p) { return hearsay::is_synchronous(p.peer().algorithm()); })
      .def_property_readonly("steps", [](PyPeer& p) { return p.peer().steps(); })
      .def_property_readonly("total_steps", [](PyPeer& p) { return p.peer().total_steps(); })
      .def_property_readonly("epochs_done", [](PyPeer& p) { return p.peer().epochs_done(); })
      .def_property_readonly("data_batches_fed", [](PyPeer& p) { return p.peer().data_batches_fed(); })
      .def_property_readonly("bytes_sent", [](PyPeer& p) { return p.peer().bytes_sent(); })
      .def_property_readonly("seed", [](PyPeer& p) { return p.peer().spec().seed; })
      .def_property_readonly("device", [](PyPeer& p) { return p.peer().spec().device; })
      .def_property_readonly("threads", [](PyPeer& p) { return p.peer().spec().threads; })
      .def_property_readonly("batch_size", [](PyPeer& p) { return p.peer().spec().train.batch_size; })
      .def_property_readonly("eval_batch_size", [](PyPeer& p) { return p.peer().spec().train.eval_batch_size; })
      .def_property_readonly("test_size", [](PyPeer& p) { return p.peer().data().test.size; })
      .def_property_readonly("shard_size", [](PyPeer& p) { return p.peer().shard_size(); })
      .def_property_readonly("checkpoint_dir", [](PyPeer& p) { return p.peer().spec().checkpoint_dir; })
      .def_property_readonly("checkpoint_every_steps", [](PyPeer& p) { return p.peer().spec().checkpoint_every_steps; })
      .def_property_readonly("resume", [](PyPeer& p) { return p.peer().spec().resume; })
      .def_property_readonly("model_config", [](PyPeer& p) { return model_dict(p.peer().spec().model); })
      .def_property_readonly("optim_config",
                             [](PyPeer& p) { return optim_dict(p.peer().spec().optimizer, p.peer().spec().schedule); });
}

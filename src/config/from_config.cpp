#include "hearsay/config.h"
#include "hearsay/config.pb.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <openssl/evp.h>
#include "hearsay/error.h"

namespace hearsay {

TrainTest load_data(const config::DataConfig& d, uint64_t seed, int context) {
  TrainTest tt;
  switch (d.format()) {
    case config::DataConfig::IDX: {
      const std::string name = d.dir() == kFashionMnistDir ? "fashion-mnist" : d.dir();
      tt = load_mnist_dir(d.dir(), name);
      break;
    }
    case config::DataConfig::LIBSVM: {
      tt.train = load_libsvm(d.train_path(), d.num_features(), d.num_classes());
      // The test file must agree with the training file's shape.
      tt.test = load_libsvm(d.test_path(), tt.train.dim(), tt.train.num_classes);
      break;
    }
    case config::DataConfig::SYNTHETIC:
      tt = make_synthetic(d.synthetic_train(), d.synthetic_test(), d.synthetic_dim(),
                          d.num_classes() > 0 ? d.num_classes() : 10, d.synthetic_separation(), seed);
      break;
    case config::DataConfig::TEXT:
      tt = load_text(d.text_path(), context, d.validation_fraction(), d.document_regex());
      if (d.test_limit() > 0 && d.test_limit() < tt.test.size) tt.test.size = d.test_limit();
      return tt;
  }
  if (d.test_limit() > 0 && d.test_limit() < tt.test.size) {
    tt.test.size = d.test_limit();
    tt.test.features.resize(static_cast<size_t>(tt.test.size) * tt.test.dim());
    tt.test.labels.resize(tt.test.size);
  }
  return tt;
}

ModelSpec model_spec(const config::ModelConfig& m, const Dataset& train) {
  ModelSpec s;
  s.height = train.height;
  s.width = train.width;
  s.channels = train.channels;
  s.num_classes = train.num_classes;
  switch (m.kind()) {
    case config::ModelConfig::LOGREG: s.kind = ModelSpec::Kind::kLogReg; break;
    case config::ModelConfig::MLP: s.kind = ModelSpec::Kind::kMlp; break;
    case config::ModelConfig::CNN: s.kind = ModelSpec::Kind::kCnn; break;
    case config::ModelConfig::GPT: s.kind = ModelSpec::Kind::kGpt; break;
  }
  const bool text = train.is_text();
  if (text != (s.kind == ModelSpec::Kind::kGpt)) {
    throw InputError(text ? "model.kind: text data (data.format TEXT) trains model GPT, not " + config::ModelConfig::Kind_Name(m.kind())
                          : "model.kind GPT trains on text: set data.format TEXT");
  }
  const config::GptConfig& g = m.gpt();
  s.gpt = GptSpec{.vocab = 256, .context = g.context(), .layers = g.layers(), .heads = g.heads(), .width = g.width()};
  s.hidden.assign(m.hidden().begin(), m.hidden().end());
  s.conv_channels.assign(m.conv_channels().begin(), m.conv_channels().end());
  if (s.conv_channels.empty()) s.conv_channels = {16, 32};
  s.kernel = m.kernel();
  s.fc_width = m.fc_width();
  check_model_spec(s);
  return s;
}

std::string optimizer_name(const config::OptimConfig& o) {
  if (!o.has_kind()) return o.optimizer();
  // The deprecated enum names one of the first two optimizers.
  const std::string by_kind = o.kind() == config::OptimConfig::ADAMW ? "adamw" : "sgd";
  if (o.has_optimizer() && o.optimizer() != by_kind) {
    throw InputError("optim.kind: " + config::OptimConfig::Kind_Name(o.kind()) + " (deprecated) stands for optimizer '" +
                     by_kind + "', but optim.optimizer is '" + o.optimizer() + "'; name the one you mean with optimizer alone");
  }
  return by_kind;
}

OptimizerSpec optimizer_spec(const config::OptimConfig& o) {
  OptimizerSpec s;
  s.name = optimizer_name(o);
  s.momentum = o.momentum();
  s.nesterov = o.nesterov();
  s.weight_decay = o.weight_decay();
  s.beta1 = o.beta1();
  s.beta2 = o.beta2();
  s.eps = o.eps();
  s.grad_clip_norm = o.grad_clip_norm();
  return s;
}

LrSchedule lr_schedule(const config::OptimConfig& o, int64_t total_steps) {
  LrSchedule s;
  switch (o.schedule()) {
    case config::OptimConfig::CONSTANT: s.kind = LrSchedule::Kind::kConstant; break;
    case config::OptimConfig::STEP: s.kind = LrSchedule::Kind::kStep; break;
    case config::OptimConfig::COSINE: s.kind = LrSchedule::Kind::kCosine; break;
  }
  s.base_lr = o.lr();
  s.warmup_steps = o.warmup_steps();
  s.step_size = o.step_size();
  s.gamma = o.gamma();
  s.total_steps = total_steps;
  s.min_lr = o.min_lr();
  return s;
}

namespace {

// SHA-256 of a message, deterministically serialised; its first 4 bytes in hex.
std::string short_digest(const google::protobuf::Message& m) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  HEARSAY_CHECK(EVP_Digest(bytes.data(), bytes.size(), md, &md_len, EVP_sha256(), nullptr) == 1 && md_len >= 4,
                "SHA-256 failed");
  static const char* hex = "0123456789abcdef";
  std::string text;
  for (int i = 0; i < 4; ++i) {
    text += hex[md[i] >> 4];
    text += hex[md[i] & 15];
  }
  return text;
}

// What makes a checkpoint this run's, a part at a time ("seed=..;model=..;...", so a
// refusal can say which part differs): the seed, the model, the data and this peer's
// shard, the optimizer and its schedule, the batch, the cluster's id and algorithm. Not
// how long it trains, where its data lie, how it logs or evaluates: a run resumed with
// more epochs, or with its data moved, is the same run.
std::string training_digest(const config::Config& c) {
  config::DataConfig data = c.data();
  data.clear_dir();
  data.clear_train_path();
  data.clear_test_path();
  data.clear_text_path();
  std::string d = "seed=" + std::to_string(c.seed()) + ";model=" + short_digest(c.model()) + ";data=" + short_digest(data) +
                  ";optim=" + short_digest(c.optim()) + ";batch=" + std::to_string(c.train().batch_size());
  if (c.cluster().peers_size() >= 2) d += ";cluster=" + c.cluster().id() + ";algorithm=" + c.cluster().gossip().algorithm();
  return d;
}

}  // namespace

PeerSpec peer_spec(const config::Config& c) {
  PeerSpec s;
  s.name = c.name();
  s.seed = c.seed();
  s.device = c.device();
  s.threads = c.threads();
  s.data = load_data(c.data(), c.seed(), c.model().gpt().context());
  const auto& d = c.data();
  s.num_shards = d.num_shards();
  s.shard = d.shard();
  switch (d.partition()) {
    case config::DataConfig::IID: s.partition = Partition::kIid; break;
    case config::DataConfig::DIRICHLET: s.partition = Partition::kDirichlet; break;
    case config::DataConfig::DOCUMENTS: s.partition = Partition::kDocuments; break;
  }
  s.dirichlet_alpha = d.dirichlet_alpha();
  s.model = model_spec(c.model(), s.data.train);
  s.model_description = c.model().ShortDebugString();
  s.optimizer = optimizer_spec(c.optim());
  s.schedule = lr_schedule(c.optim(), 0);
  const auto& t = c.train();
  s.train.batch_size = t.batch_size();
  s.train.epochs = t.epochs();
  s.train.max_steps = t.max_steps();
  s.train.target_test_acc = t.target_test_acc();
  s.train.eval_every_steps = t.eval_every_steps();
  s.train.eval_batch_size = t.eval_batch_size();
  s.train.eval_every_s = t.eval_every_s();
  s.train.emulated_step_s = t.emulated_step_s();
  s.train.emulated_eval_s = t.emulated_eval_s();
  s.log_every_steps = c.log().every_steps();
  s.checkpoint_dir = c.checkpoint().dir();
  s.checkpoint_every_steps = c.checkpoint().every_steps();
  s.resume = c.checkpoint().resume();
  s.weights_from_other_run = c.checkpoint().weights_from_other_run();
  if (c.cluster().peers_size() >= 2) s.cluster_id = c.cluster().id();
  s.training_digest = training_digest(c);
  return s;
}

}  // namespace hearsay

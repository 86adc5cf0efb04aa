#include "tls.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string_view>

#include "hearsay/error.h"

namespace hearsay {
namespace {

constexpr std::string_view kIdentityPrefix = "hearsay-psk-v1/";
constexpr size_t kTlsReadAheadBytes = 64 * 1024;
// TLS_AES_128_GCM_SHA256 first: the fastest where AES-NI is (loopback bench, BENCHMARKS.md).
constexpr const char* kSuites = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

int note_index() {
  static const int i = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return i;
}
int context_index() {
  static const int i = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return i;
}

// The oldest error OpenSSL queued on this thread, as text; clears the queue.
std::string openssl_error() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

// A socket BIO that never raises SIGPIPE (OpenSSL's own send()s without MSG_NOSIGNAL, and
// a peer that goes away mid-write would kill the process), and that gathers up to
// kTlsCoalesceBytes of records before it sends them: OpenSSL writes one record (16 KiB)
// at a time, and a send() per record cost a fifth of TLS throughput at 16 MiB. What is
// gathered goes out on a flush, which the connection asks for at the end of each frame
// and OpenSSL at the end of each handshake flight. The descriptor stays the caller's.
constexpr size_t kTlsCoalesceBytes = 128 * 1024;

struct SocketBio {
  int fd = -1;
  std::string out;  // records gathered, out[sent..] not yet sent
  size_t sent = 0;
  size_t pending() const { return out.size() - sent; }
};

SocketBio& state_of(BIO* b) { return *static_cast<SocketBio*>(BIO_get_data(b)); }

// Sends what is gathered. 1: all sent; 0: the socket is full (retry flag set); -1: a
// socket error (errno says which).
int drain(BIO* b, SocketBio& s) {
  while (s.pending() > 0) {
    const ssize_t n = ::send(s.fd, s.out.data() + s.sent, s.pending(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        BIO_set_retry_write(b);
        return 0;
      }
      return -1;
    }
    s.sent += static_cast<size_t>(n);
  }
  s.out.clear();
  s.sent = 0;
  return 1;
}

int bio_write(BIO* b, const char* data, size_t len, size_t* written) {
  BIO_clear_retry_flags(b);
  SocketBio& s = state_of(b);
  if (s.pending() + len > kTlsCoalesceBytes && drain(b, s) < 0) return 0;
  const size_t room = kTlsCoalesceBytes - std::min(kTlsCoalesceBytes, s.pending());
  if (room == 0) return 0;  // the socket is full (drain set the retry flag)
  BIO_clear_retry_flags(b);
  if (s.sent > 0) {  // a partial send left a tail: keep the buffer within its bound
    s.out.erase(0, s.sent);
    s.sent = 0;
  }
  const size_t take = std::min(room, len);
  s.out.append(data, take);
  *written = take;
  return 1;
}

int bio_read(BIO* b, char* data, size_t len, size_t* got) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::recv(state_of(b).fd, data, len, 0);
  if (n > 0) {
    *got = static_cast<size_t>(n);
    return 1;
  }
  if (n == 0) {
    errno = 0;  // the peer closed: OpenSSL reads that as an unexpected EOF
    return 0;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) BIO_set_retry_read(b);
  return 0;
}

long bio_ctrl(BIO* b, int cmd, long, void*) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      BIO_clear_retry_flags(b);
      return drain(b, state_of(b)) > 0 ? 1 : 0;
    case BIO_CTRL_WPENDING: return static_cast<long>(state_of(b).pending());
    default: return 0;
  }
}

int bio_create(BIO* b) {
  BIO_set_data(b, new SocketBio);
  BIO_set_init(b, 1);
  return 1;
}

int bio_destroy(BIO* b) {
  delete static_cast<SocketBio*>(BIO_get_data(b));
  BIO_set_data(b, nullptr);
  return 1;
}

const BIO_METHOD* socket_method() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "hearsay socket");
    HEARSAY_CHECK(method != nullptr && BIO_meth_set_write_ex(method, bio_write) == 1 && BIO_meth_set_read_ex(method, bio_read) == 1 &&
                      BIO_meth_set_ctrl(method, bio_ctrl) == 1 && BIO_meth_set_create(method, bio_create) == 1 && BIO_meth_set_destroy(method, bio_destroy) == 1,
                  "cannot make the socket BIO");
    return method;
  }();
  return m;
}

}  // namespace

std::string tls_psk(const std::string& secret, const std::string& cluster_id) {
  std::string info = "hearsay tls psk v1";
  info.push_back('\0');
  info += cluster_id;
  unsigned char out[32];
  size_t len = sizeof out;
  EVP_PKEY_CTX* p = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  const bool ok = p != nullptr && EVP_PKEY_derive_init(p) > 0 && EVP_PKEY_CTX_set_hkdf_md(p, EVP_sha256()) > 0 &&
                  EVP_PKEY_CTX_set1_hkdf_salt(p, reinterpret_cast<const unsigned char*>("hearsay"), 7) > 0 &&
                  EVP_PKEY_CTX_set1_hkdf_key(p, reinterpret_cast<const unsigned char*>(secret.data()),
                                             static_cast<int>(secret.size())) > 0 &&
                  EVP_PKEY_CTX_add1_hkdf_info(p, reinterpret_cast<const unsigned char*>(info.data()),
                                              static_cast<int>(info.size())) > 0 &&
                  EVP_PKEY_derive(p, out, &len) > 0;
  EVP_PKEY_CTX_free(p);
  HEARSAY_CHECK(ok && len == sizeof out, "HKDF-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}

TlsContext::TlsContext(const TransportOptions& o) : ctx_(asio::ssl::context::tls) {
  SSL_CTX* c = ctx_.native_handle();
  HEARSAY_CHECK(SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) == 1 && SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION) == 1,
                "TLS 1.3 unavailable");
  // No tickets, no cache: every connection authenticates afresh.
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  // OpenSSL reads the socket itself (tcp_transport.cpp): ahead, in large reads.
  SSL_CTX_set_read_ahead(c, 1);
  SSL_CTX_set_default_read_buffer_len(c, kTlsReadAheadBytes);
  const int given = !o.tls_cert_file.empty() + !o.tls_key_file.empty() + !o.tls_ca_file.empty();
  if (given != 0 && given != 3) {
    throw InputError("tcp transport: TLS certificates need all three of tls_cert_file, tls_key_file and tls_ca_file");
  }
  if (given == 3) {
    certificates_ = true;
    HEARSAY_CHECK(SSL_CTX_set_ciphersuites(c, kSuites) == 1, "TLS 1.3 cipher suites unavailable");
    auto load = [&](bool ok, const char* field, const std::string& file) {
      if (!ok) throw InputError(std::string("tcp transport: ") + field + " '" + file + "': " + openssl_error());
    };
    load(SSL_CTX_use_certificate_chain_file(c, o.tls_cert_file.c_str()) == 1, "tls_cert_file", o.tls_cert_file);
    load(SSL_CTX_use_PrivateKey_file(c, o.tls_key_file.c_str(), SSL_FILETYPE_PEM) == 1, "tls_key_file", o.tls_key_file);
    load(SSL_CTX_check_private_key(c) == 1, "tls_key_file", o.tls_key_file);
    load(SSL_CTX_load_verify_locations(c, o.tls_ca_file.c_str(), nullptr) == 1, "tls_ca_file", o.tls_ca_file);
    // Both sides show a certificate, both verify the other's (the names are checked at
    // admission, against the name the peer claims).
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    return;
  }
  // PSK mode: the session's cipher fixes the PSK's hash (SHA-256), so only suites with it.
  HEARSAY_CHECK(SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256") == 1,
                "TLS 1.3 cipher suites unavailable");
  identity_ = std::string(kIdentityPrefix) + o.cluster_id;
  const std::string key = tls_psk(o.secret, o.cluster_id);
  SSL* probe = SSL_new(c);
  HEARSAY_CHECK(probe != nullptr, "SSL_new failed");
  const unsigned char aes128gcm[2] = {0x13, 0x01};
  const SSL_CIPHER* cipher = SSL_CIPHER_find(probe, aes128gcm);
  SSL_free(probe);
  psk_ = SSL_SESSION_new();
  HEARSAY_CHECK(cipher != nullptr && psk_ != nullptr &&
                    SSL_SESSION_set1_master_key(psk_, reinterpret_cast<const unsigned char*>(key.data()), key.size()) == 1 &&
                    SSL_SESSION_set_cipher(psk_, cipher) == 1 && SSL_SESSION_set_protocol_version(psk_, TLS1_3_VERSION) == 1,
                "cannot build the TLS pre-shared key session");
  SSL_CTX_set_ex_data(c, context_index(), this);
  SSL_CTX_set_psk_use_session_callback(c, &TlsContext::use_session);
  SSL_CTX_set_psk_find_session_callback(c, &TlsContext::find_session);
}

TlsContext::~TlsContext() {
  if (psk_ != nullptr) SSL_SESSION_free(psk_);
}

void TlsContext::attach(SSL* ssl, TlsNote* note) { SSL_set_ex_data(ssl, note_index(), note); }

void TlsContext::set_socket(SSL* ssl, int fd) {
  BIO* b = BIO_new(socket_method());
  HEARSAY_CHECK(b != nullptr, "BIO_new failed");
  state_of(b).fd = fd;
  SSL_set_bio(ssl, b, b);  // one BIO both ways; the SSL object owns it
}

// Client side: offer the cluster's key (OpenSSL takes ownership of one reference).
int TlsContext::use_session(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen, SSL_SESSION** sess) {
  auto* self = static_cast<TlsContext*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), context_index()));
  *sess = nullptr;
  *id = nullptr;
  *idlen = 0;
  // A second call names the hash of the suite the server chose; ours is SHA-256.
  if (self == nullptr || (md != nullptr && EVP_MD_get_type(md) != NID_sha256)) return 1;
  SSL_SESSION_up_ref(self->psk_);
  *sess = self->psk_;
  *id = reinterpret_cast<const unsigned char*>(self->identity_.data());
  *idlen = self->identity_.size();
  return 1;
}

// Server side: the client's key must be our cluster's. Without one the handshake fails
// (there is no certificate to fall back on); the note says why.
int TlsContext::find_session(SSL* ssl, const unsigned char* id, size_t idlen, SSL_SESSION** sess) {
  auto* self = static_cast<TlsContext*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), context_index()));
  *sess = nullptr;
  if (self == nullptr) return 1;
  const std::string_view got(reinterpret_cast<const char*>(id), idlen);
  if (got == self->identity_) {
    SSL_SESSION_up_ref(self->psk_);
    *sess = self->psk_;
    return 1;
  }
  if (auto* note = static_cast<TlsNote*>(SSL_get_ex_data(ssl, note_index()))) {
    note->why = got.substr(0, kIdentityPrefix.size()) == kIdentityPrefix
                    ? "wrong cluster '" + wire_text(got.substr(kIdentityPrefix.size())) + "' (TLS key identity)"
                    : "unknown TLS key identity '" + wire_text(got) + "'";
  }
  return 1;
}

std::string TlsContext::failure(SSL* ssl, const asio::error_code& ec) {
  const auto* note = ssl != nullptr ? static_cast<TlsNote*>(SSL_get_ex_data(ssl, note_index())) : nullptr;
  if (note != nullptr && !note->why.empty()) return "admission: " + note->why;
  if (ec == asio::ssl::error::stream_truncated || ec == asio::error::eof || ec == asio::error::connection_reset) {
    return "admission: TLS handshake: the peer closed the connection (another cluster secret? cluster.tls off there?)";
  }
  if (ec.category() == asio::error::get_ssl_category()) {
    switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
      case SSL_R_BINDER_DOES_NOT_VERIFY:
      case SSL_R_BAD_PSK:
        return "admission: wrong proof of the cluster secret (TLS: the pre-shared key does not verify)";
      case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
        return "admission: TLS handshake refused by the peer: decrypt error (another cluster secret?)";
      // What OpenSSL's server answers when the pre-shared key's binder does not verify.
      case SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER:
        return "admission: TLS handshake refused by the peer: illegal parameter (another cluster secret?)";
      case SSL_R_WRONG_VERSION_NUMBER:
      case SSL_R_HTTP_REQUEST:
      case SSL_R_PACKET_LENGTH_TOO_LONG:
        return "admission: TLS handshake failed: " + ec.message() +
               " (the peer does not speak TLS: cluster.tls must be the same on every peer)";
      case SSL_R_CERTIFICATE_VERIFY_FAILED:
        return std::string("admission: the peer's TLS certificate does not verify: ") +
               X509_verify_cert_error_string(ssl != nullptr ? SSL_get_verify_result(ssl) : X509_V_ERR_UNSPECIFIED);
      default:
        break;
    }
  }
  return "admission: TLS handshake failed: " + ec.message();
}

std::vector<std::string> TlsContext::peer_names(SSL* ssl) {
  std::vector<std::string> names;
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) return names;
  X509_NAME* subject = X509_get_subject_name(cert);
  for (int i = -1; (i = X509_NAME_get_index_by_NID(subject, NID_commonName, i)) >= 0;) {
    const ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
    names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), ASN1_STRING_length(s));
  }
  auto* sans = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans != nullptr && i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
    if (g->type != GEN_DNS) continue;
    names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(g->d.dNSName)), ASN1_STRING_length(g->d.dNSName));
  }
  GENERAL_NAMES_free(sans);
  return names;
}

}  // namespace hearsay

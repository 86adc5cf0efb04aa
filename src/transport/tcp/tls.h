// TLS 1.3 for the tcp transport (docs/WIRE.md, "Trust"). Two ways to authenticate the
// link, both before the admission handshake runs inside it:
// - a pre-shared key derived from the cluster secret (the default; no certificates):
//   external PSKs with psk_dhe_ke, so each connection still gets fresh ECDHE keys;
// - per-site certificates, where the options name a certificate, its key and the CA:
//   each side verifies the other's certificate against the CA, and the name a peer
//   claims in admission must be the certificate's CN or one of its DNS SANs.
#pragma once

#include <openssl/ssl.h>

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <string>
#include <vector>

#include "hearsay/transport.h"

namespace hearsay {

// The cluster's TLS pre-shared key: HKDF-SHA256 (RFC 5869), salt "hearsay", input key
// the secret, info "hearsay tls psk v1" | 0x00 | cluster_id; 32 bytes.
std::string tls_psk(const std::string& secret, const std::string& cluster_id);

// What one connection's handshake callbacks learnt, for the failure message. Owned by
// the connection; it must outlive the connection's SSL object.
struct TlsNote {
  std::string why;
};

// One transport's TLS setup. Built once; then used from any I/O thread (OpenSSL
// contexts are thread-safe once configured).
class TlsContext {
 public:
  // Throws InputError when a certificate file cannot be read or only some are given.
  explicit TlsContext(const TransportOptions& o);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  asio::ssl::context& context() { return ctx_; }
  bool uses_certificates() const { return certificates_; }
  // Ties a new connection's SSL object to its note (before the handshake).
  static void attach(SSL* ssl, TlsNote* note);
  // OpenSSL reads and writes the non-blocking socket `fd` itself (without SIGPIPE); the
  // descriptor stays the caller's to close.
  static void set_socket(SSL* ssl, int fd);
  // A handshake failure as a rejection reason ("admission: ...").
  static std::string failure(SSL* ssl, const asio::error_code& ec);
  // The subject CN and DNS SANs of the peer's verified certificate (certificate mode).
  static std::vector<std::string> peer_names(SSL* ssl);

 private:
  static int use_session(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen, SSL_SESSION** sess);
  static int find_session(SSL* ssl, const unsigned char* id, size_t idlen, SSL_SESSION** sess);

  asio::ssl::context ctx_;
  bool certificates_ = false;
  std::string identity_;          // "hearsay-psk-v1/" + cluster id
  SSL_SESSION* psk_ = nullptr;    // the PSK as a resumable TLS 1.3 session
};

}  // namespace hearsay

#include "libfabric.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "hearsay/error.h"

namespace hearsay::fabric {
namespace {

template <class F>
void bind(void* lib, const char* name, F* out) {
  void* f = dlsym(lib, name);
  if (f == nullptr) throw InputError(std::string("fabric: libfabric.so.1 has no ") + name + " (" + dlerror() + ")");
  *out = reinterpret_cast<F>(f);
}

Libfabric load() {
  // libinfinipath's documented switch: with it set, its constructor installs no handlers.
  setenv("IPATH_NO_BACKTRACE", "1", 0);
  void* lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw InputError(std::string("fabric: cannot load libfabric.so.1 (") + (why ? why : "?") +
                     "); install Debian's libfabric1, or use transport: \"tcp\"");
  }
  // Never unloaded: its providers keep threads and handlers of their own.
  Libfabric f{};
  bind(lib, "fi_getinfo", &f.getinfo);
  bind(lib, "fi_freeinfo", &f.freeinfo);
  bind(lib, "fi_dupinfo", &f.dupinfo);
  bind(lib, "fi_fabric", &f.fabric);
  bind(lib, "fi_strerror", &f.strerror);
  return f;
}

}  // namespace

const Libfabric& libfabric() {
  static std::once_flag once;
  static Libfabric loaded;
  std::call_once(once, [] { loaded = load(); });  // a throw leaves it to be tried again
  return loaded;
}

}  // namespace hearsay::fabric

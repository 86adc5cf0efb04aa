// What a transport does with memory registered for it when it needs no registration.
#include "hearsay/error.h"
#include "hearsay/transport.h"

namespace hearsay {

// tcp and inproc copy every byte through the kernel or a queue from host memory; nothing
// to register, and nothing of theirs can read a GPU's memory.
MemoryRegistration Transport::register_memory(void* data, size_t bytes, MemoryKind memory) {
  if (memory == MemoryKind::kDevice) {
    throw InputError(kind() + ": cannot register device memory (" + std::to_string(bytes) +
                     " bytes): this transport sends and receives host memory only");
  }
  return MemoryRegistration(data, bytes, memory, kind() + ": no registration (it copies from host memory as it is)");
}

}  // namespace hearsay

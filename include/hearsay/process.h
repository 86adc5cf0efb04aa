// What a hearsay program sets up about its own process.
#pragma once

namespace hearsay {

// Every neighbour costs a descriptor or two (and a simulated peer's log one), and so does
// each connection a stranger opens until the tcp transport's caps close it: takes what
// the hard limit allows. Silent where the limit cannot be read or raised.
void raise_descriptor_limit();

}  // namespace hearsay

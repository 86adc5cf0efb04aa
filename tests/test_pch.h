// The headers nearly every test includes, compiled once for all the test executables
// (tests/CMakeLists.txt, REUSE_FROM): they were about two thirds of each test's compile time.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "hearsay/backend.h"
#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/peer.h"
#include "hearsay/transport.h"

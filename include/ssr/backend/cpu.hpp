// The CPU backend: CpuBackend<T> (vector extensions, OpenMP), for translation units that include it on its own.
#pragma once

#include "ssr/backend/cpu/backend.hpp"

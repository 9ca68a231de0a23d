// The Thrust backend: ThrustBackend<T> over Thrust's device system (target ssr::thrust).
#pragma once

#include "ssr/backend/thrust/backend.hpp"

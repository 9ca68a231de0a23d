// SSR_HD marks functions that run on the host and, under nvcc, on the device too.
#pragma once

#if defined(__CUDACC__)
#define SSR_HD __host__ __device__
#else
#define SSR_HD
#endif

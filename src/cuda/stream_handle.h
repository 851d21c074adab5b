// The stream handle type, nameable from plain C++ headers without CUDA headers.
// Real build: the same type as cudaStream_t (CUDA declares `typedef struct CUstream_st* cudaStream_t`).
// Simulator: an opaque pointer; runtime_sim.cc defines the struct.
#pragma once

struct CUstream_st;
using gpu_stream_t = CUstream_st*;

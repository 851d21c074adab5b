// Measured tensor-core peaks for bench roofline ratios: a kernel that issues mma.sync back to
// back on register fragments (no memory traffic), on every SM.
#pragma once

namespace dsv4::bench {

// Dense TFLOP/s of mma.sync m16n8k32 e4m3 (fp8 = true) or m16n8k16 bf16, fp32 accumulation.
double measure_mma_peak_tflops(bool fp8);

}  // namespace dsv4::bench

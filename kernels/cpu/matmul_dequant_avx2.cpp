#include "kernels/cpu/matmul_kernels.h"

namespace fathom::cpu::detail {

void register_avx2_dequant(KernelTable& t) { (void)t; }

}  // namespace fathom::cpu::detail

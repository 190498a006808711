#include "kernels/cpu/matmul_kernels.h"

namespace fathom::cpu::detail {

void register_avx512_dequant(KernelTable& t) { (void)t; }

}  // namespace fathom::cpu::detail

// The SIMT simulator (see simt.h for the model). One launch runs at a time (a process-wide mutex);
// its blocks run one after another on the calling OS thread. Each thread of a block is a fiber:
// a stack of its own (256 KB by default, DSV4_SIM_STACK_KB to change, with a guard page below)
// and a saved stack pointer. A hand-written x86-64 switch saves the callee-saved registers on the
// old stack and loads the new stack pointer (no system call; glibc's swapcontext would make one
// per switch to save the signal mask). Other architectures, or -DDSV4_SIM_UCONTEXT, use ucontext.
//
// The scheduler (the launching thread's own stack) resumes fibers warp by warp. A fiber runs until
// it waits (a barrier or a warp collective), exits, or fails; then control returns to the
// scheduler, which releases whatever can be released and resumes the next runnable fiber.
#include "cuda/sim/simt.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define DSV4_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DSV4_SIM_ASAN 1
#endif
#endif
#if defined(DSV4_SIM_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__) && !defined(DSV4_SIM_UCONTEXT)
#define DSV4_SIM_UCONTEXT 1
#endif
#if defined(DSV4_SIM_UCONTEXT)
#include <ucontext.h>
#endif

namespace dsv4::gpu::sim {
namespace {

constexpr unsigned kMaxThreads = 1024;
constexpr std::size_t kDefaultSmemLimit = 48 * 1024;  // without set_max_dynamic_smem
constexpr std::size_t kOptinSmemLimit = 227 * 1024;   // H100/H200 opt-in maximum per block
constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------------------------
struct Context {
#if defined(DSV4_SIM_UCONTEXT)
  ucontext_t uc;
#else
  void* sp = nullptr;  // the saved stack pointer; the registers are on that stack
#endif
};

}  // namespace
}  // namespace dsv4::gpu::sim

extern "C" {
// Entry of a fresh fiber: runs the kernel for the fiber given as argument; never returns.
[[noreturn]] void dsv4_sim_fiber_main(void* fiber);
}

#if !defined(DSV4_SIM_UCONTEXT)
extern "C" {
// Saves the callee-saved registers rbp, rbx, r12-r15 on the current stack, stores the stack
// pointer in *save_sp, switches to load_sp and restores them from there. The x87 control word and
// MXCSR are not switched (saving them costs more than the rest of the switch): kernels must not
// change floating-point modes.
void dsv4_sim_switch(void** save_sp, void* load_sp);
// First code of a fresh fiber (reached through the `ret` of dsv4_sim_switch): calls r13(r12).
void dsv4_sim_fiber_start();
}
asm(R"(
    .pushsection .text
    .p2align 4
    .globl dsv4_sim_switch
    .hidden dsv4_sim_switch
    .type dsv4_sim_switch, @function
dsv4_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size dsv4_sim_switch, .-dsv4_sim_switch

    .p2align 4
    .globl dsv4_sim_fiber_start
    .hidden dsv4_sim_fiber_start
    .type dsv4_sim_fiber_start, @function
dsv4_sim_fiber_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %r12, %rdi
    callq *%r13
    ud2
    .cfi_endproc
    .size dsv4_sim_fiber_start, .-dsv4_sim_fiber_start
    .popsection
)");
#endif

namespace dsv4::gpu::sim {
namespace {

enum class State : std::uint8_t {
  kReady,      // can run
  kBarrier,    // waits at a block barrier
  kWarp,       // waits at a warp collective
  kMbarrier,   // waits for an mbarrier phase
  kNamed,      // waits at a named barrier (data: its id, pred: its thread count)
  kRegisters,  // waits in setmaxnreg_inc for registers (pred: how many)
  kCluster,    // waits at the cluster barrier (cluster_sync)
  kExited,     // returned from the kernel
  kFailed,     // reported an error (kThrow mode) or threw
};

struct Fiber;

// A kind of warp collective: all lanes of one release must wait at the same kind.
struct Collective {
  const char* name;
  // Computes every lane's result from the lanes in `group` (lanes[i]->data is lane i's record).
  void (*resolve)(Fiber* const* lanes, unsigned group);
};

struct PendingCopy {
  unsigned char* dst;
  unsigned group;
  unsigned char bytes[16];
};

// An mbarrier of the running block (keyed by its address): the current phase's arrivals still
// expected, its transaction bytes still outstanding, its bulk copies, and the copies of completed
// phases that no thread has waited for yet: they land when a thread's wait sees their phase
// complete (as late as the hardware may make them visible), so a read without a wait sees stale
// shared memory.
struct PendingBulk {
  unsigned char* dst;
  std::vector<unsigned char> bytes;
};
struct Mbarrier {
  unsigned expected = 0;
  unsigned pending = 0;
  long long tx = 0;
  unsigned phase = 0;  // completed phases
  std::vector<PendingBulk> copies;
  std::vector<PendingBulk> completed;
};

// A warpgroup's wgmma product in flight: its descriptors, a checksum of its operands at the first
// thread's issue, and how many of the warpgroup's threads have issued it and waited for it.
struct WgmmaProduct {
  std::uint64_t desc_a = 0, desc_b = 0;
  int b_row_groups = 0;
  std::uint64_t sum = 0;
  unsigned issued = 0, waited = 0;
  Location where;
};

struct Fiber {
  Builtins builtins{};
  Context context{};
  unsigned linear = 0;  // linear thread index in the block
  unsigned rank = 0;    // its block's rank in the cluster
  unsigned warp = 0;
  unsigned lane = 0;
  State state = State::kReady;

  // What it waits at.
  const Collective* collective = nullptr;  // State::kWarp
  unsigned mask = 0;
  void* data = nullptr;
  BarrierOp barrier_op = BarrierOp::kSync;  // State::kBarrier
  int pred = 0;
  int barrier_result = 0;
  Location where;

  // cp.async copies not yet delivered, and the number of the group being filled.
  std::vector<PendingCopy> copies;
  unsigned next_group = 0;

  unsigned registers = 0;  // its setmaxnreg budget

  // wgmma: the commit group being filled, the products issued into it, the groups waited for.
  unsigned wgmma_group = 0, wgmma_in_group = 0, wgmma_waited = 0;

  // Stack: [stack_lo, stack_lo + stack_size), with a guard page below stack_lo.
  void* mapping = nullptr;
  std::size_t mapping_size = 0;
  unsigned char* stack_lo = nullptr;
  std::size_t stack_size = 0;
  void* asan_fake_stack = nullptr;

  Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber() {
    if (mapping != nullptr) munmap(mapping, mapping_size);
  }
};

// A running block: its index, dynamic shared memory, setmaxnreg pool and wgmma products in
// flight (by warpgroup, commit group, place in group). The blocks of a cluster run together.
struct BlockRun {
  uint3 block_idx{0, 0, 0};
  unsigned char* smem = nullptr;
  unsigned free_registers = 0;
  std::map<std::tuple<unsigned, unsigned, unsigned>, WgmmaProduct> wgmma;
};

// The launch being simulated. Fiber rank * threads + i is thread i of the cluster's block `rank`.
struct Launch {
  KernelId kernel;
  dim3 grid;
  dim3 block;
  unsigned threads;  // per block
  std::size_t smem_bytes;
  void (*body)(void*);
  void* context;
  unsigned cluster = 1;          // blocks per cluster (along x)
  std::vector<BlockRun> blocks;  // of the running cluster
  std::size_t smem_capacity = 0;
};

struct Simulator {
  std::mutex launch_mutex;  // one launch at a time
  std::mutex attribute_mutex;
  std::unordered_map<KernelId, std::size_t> max_dynamic_smem;
  std::mutex name_mutex;
  std::unordered_map<KernelId, std::string> names;
  std::atomic<ErrorMode> mode{ErrorMode::kAbort};

  std::vector<std::unique_ptr<Fiber>> fibers;  // reused by every launch
  Context scheduler;
  Launch* launch = nullptr;
  Fiber* current = nullptr;
  std::string failure;  // a fiber's error report (kThrow mode)
  std::unordered_map<const void*, Mbarrier> mbarriers;  // of the running cluster's blocks
  std::exception_ptr kernel_exception;

  // AddressSanitizer's view of the scheduler stack.
  const void* scheduler_stack_bottom = nullptr;
  std::size_t scheduler_stack_size = 0;
  void* scheduler_fake_stack = nullptr;
};

Simulator& sim() {
  static Simulator* s = new Simulator;  // never destroyed: fibers may outlive static destructors
  return *s;
}

// ---------------------------------------------------------------------------------------------
// Names and reports
// ---------------------------------------------------------------------------------------------
std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

// The name of the function symbol at `value` in the ELF file's full symbol table (which, unlike
// the dynamic one, also lists functions that are not exported, such as kernels in anonymous
// namespaces). Empty when not found.
std::string elf_symbol(const char* path, const void* address, const void* load_base) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
    close(fd);
    return {};
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return {};
  std::string result;
  const auto* base = static_cast<const unsigned char*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  const bool elf64 = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64;
  if (elf64 && eh->e_shoff != 0 && eh->e_shentsize == sizeof(Elf64_Shdr) &&
      eh->e_shoff + std::size_t{eh->e_shnum} * sizeof(Elf64_Shdr) <= size) {
    const auto* sections = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    const auto target = reinterpret_cast<std::uintptr_t>(address) -
                        (eh->e_type == ET_DYN ? reinterpret_cast<std::uintptr_t>(load_base) : 0);
    for (unsigned i = 0; i < eh->e_shnum && result.empty(); ++i) {
      const Elf64_Shdr& sh = sections[i];
      if (sh.sh_type != SHT_SYMTAB || sh.sh_link >= eh->e_shnum) continue;
      const Elf64_Shdr& strtab = sections[sh.sh_link];
      if (sh.sh_offset + sh.sh_size > size || strtab.sh_offset + strtab.sh_size > size) continue;
      const auto* symbols = reinterpret_cast<const Elf64_Sym*>(base + sh.sh_offset);
      const std::size_t count = sh.sh_size / sizeof(Elf64_Sym);
      for (std::size_t k = 0; k < count; ++k) {
        const Elf64_Sym& sym = symbols[k];
        if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value != target || sym.st_name >= strtab.sh_size) {
          continue;
        }
        const char* name = reinterpret_cast<const char*>(base + strtab.sh_offset + sym.st_name);
        if (std::memchr(name, 0, strtab.sh_size - sym.st_name) != nullptr) {
          result = demangle(name);
          break;
        }
      }
    }
  }
  munmap(map, size);
  return result;
}

std::string symbolize(KernelId kernel) {
  void* address = nullptr;
  static_assert(sizeof(address) == sizeof(kernel));
  std::memcpy(&address, &kernel, sizeof(address));
  Dl_info info{};
  if (dladdr(address, &info) != 0) {
    if (info.dli_sname != nullptr && info.dli_saddr == address) return demangle(info.dli_sname);
    if (info.dli_fname != nullptr && info.dli_fname[0] == '/') {
      std::string name = elf_symbol(info.dli_fname, address, info.dli_fbase);
      if (!name.empty()) return name;
    }
    std::string name = elf_symbol("/proc/self/exe", address, info.dli_fbase);
    if (!name.empty()) return name;
  }
  return fmt::format("kernel at {}", address);
}

const std::string& kernel_name(KernelId kernel) {
  Simulator& s = sim();
  std::lock_guard lock(s.name_mutex);
  auto it = s.names.find(kernel);
  if (it == s.names.end()) it = s.names.emplace(kernel, symbolize(kernel)).first;
  return it->second;
}

std::string format_dim(const dim3& d) { return fmt::format("({}, {}, {})", d.x, d.y, d.z); }
std::string format_dim(const uint3& d) { return fmt::format("({}, {}, {})", d.x, d.y, d.z); }

// The running fiber's block, or (from the scheduler) the running cluster's blocks.
std::string launch_description() {
  const Simulator& s = sim();
  const Launch* l = s.launch;
  if (l == nullptr) return "outside a kernel";
  std::string blocks =
      fmt::format("block {}", format_dim(l->blocks[s.current != nullptr ? s.current->rank : 0].block_idx));
  if (l->cluster > 1 && s.current == nullptr)
    blocks = fmt::format("the cluster of blocks {} to {}", format_dim(l->blocks.front().block_idx),
                         format_dim(l->blocks.back().block_idx));
  return fmt::format("kernel {}, {} of grid {}, block size {}", kernel_name(l->kernel), blocks, format_dim(l->grid),
                     format_dim(l->block));
}

std::string format_location(const Location& loc) {
  return fmt::format("{}:{}", loc.file_name(), loc.line());
}

std::string thread_description(const Fiber& f) {
  if (sim().launch != nullptr && sim().launch->cluster > 1)
    return fmt::format("thread {} (warp {}, lane {}) of block {}", format_dim(f.builtins.thread_idx), f.warp, f.lane,
                       format_dim(f.builtins.block_idx));
  return fmt::format("thread {} (warp {}, lane {})", format_dim(f.builtins.thread_idx), f.warp, f.lane);
}

const char* barrier_name(BarrierOp op) {
  switch (op) {
    case BarrierOp::kSync:
      return "__syncthreads";
    case BarrierOp::kCount:
      return "__syncthreads_count";
    case BarrierOp::kAnd:
      return "__syncthreads_and";
    case BarrierOp::kOr:
      return "__syncthreads_or";
  }
  return "?";
}

// Where a thread waits, for deadlock reports.
std::string wait_description(const Fiber& f) {
  switch (f.state) {
    case State::kReady:
      return "runnable";
    case State::kBarrier:
      return fmt::format("{} at {}", barrier_name(f.barrier_op), format_location(f.where));
    case State::kWarp:
      return fmt::format("{} (mask {:#010x}) at {}", f.collective->name, f.mask, format_location(f.where));
    case State::kMbarrier:
      return fmt::format("mbarrier_wait (barrier {}, parity {}) at {}", f.data, f.pred, format_location(f.where));
    case State::kRegisters:
      return fmt::format("setmaxnreg_inc (to {} registers a thread, {} more than it has; the block has {} free) at {}",
                         f.registers + static_cast<unsigned>(f.pred), f.pred,
                         sim().launch->blocks[f.rank].free_registers, format_location(f.where));
    case State::kNamed:
      return fmt::format("named_barrier_sync (barrier {}, {} threads) at {}", reinterpret_cast<std::uintptr_t>(f.data),
                         f.pred, format_location(f.where));
    case State::kCluster: return fmt::format("cluster_sync at {}", format_location(f.where));
    case State::kExited:
      return "exited";
    case State::kFailed:
      return "failed";
  }
  return "?";
}

// Reports an error from the scheduler (never inside a fiber).
[[noreturn]] void raise_error(const std::string& message) {
  const std::string full = "dsv4 sim: " + message;
  if (sim().mode.load() == ErrorMode::kThrow) throw SimError(full);
  std::fprintf(stderr, "%s\n", full.c_str());
  std::fflush(stderr);
  std::abort();
}

// ---------------------------------------------------------------------------------------------
// Fibers
// ---------------------------------------------------------------------------------------------
std::size_t stack_bytes() {
  static const std::size_t bytes = [] {
    std::size_t kb = 256;
    if (const char* env = std::getenv("DSV4_SIM_STACK_KB")) {
      const long v = std::atol(env);
      if (v >= 64) kb = static_cast<std::size_t>(v);
    }
    return kb * 1024;
  }();
  return bytes;
}

void allocate_stack(Fiber& f) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t usable = (stack_bytes() + page - 1) / page * page;
  f.mapping_size = usable + page;
  f.mapping = mmap(nullptr, f.mapping_size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (f.mapping == MAP_FAILED) {
    f.mapping = nullptr;
    fail("SIMT simulator: cannot map a {}-byte fiber stack", f.mapping_size);
  }
  if (mprotect(f.mapping, page, PROT_NONE) != 0) fail("SIMT simulator: cannot protect a fiber stack's guard page");
  f.stack_lo = static_cast<unsigned char*>(f.mapping) + page;
  f.stack_size = usable;
}

#if defined(DSV4_SIM_UCONTEXT)
void fiber_trampoline(unsigned hi, unsigned lo) {
  const auto address = (static_cast<std::uintptr_t>(hi) << 32) | lo;
  dsv4_sim_fiber_main(reinterpret_cast<void*>(address));
}
#endif

// Prepares f to start the kernel at its next resume.
void init_context(Fiber& f) {
#if defined(DSV4_SIM_ASAN)
  __asan_unpoison_memory_region(f.stack_lo, f.stack_size);  // frames abandoned by a failed launch
#endif
#if defined(DSV4_SIM_UCONTEXT)
  getcontext(&f.context.uc);
  f.context.uc.uc_stack.ss_sp = f.stack_lo;
  f.context.uc.uc_stack.ss_size = f.stack_size;
  f.context.uc.uc_link = nullptr;
  const auto address = reinterpret_cast<std::uintptr_t>(&f);
  makecontext(&f.context.uc, reinterpret_cast<void (*)()>(&fiber_trampoline), 2, static_cast<unsigned>(address >> 32),
              static_cast<unsigned>(address & 0xffffffffu));
#else
  // The frame dsv4_sim_switch pops: r15, r14, r13, r12, rbx, rbp, then the return address
  // dsv4_sim_fiber_start, which finds the fiber in r12 and its entry in r13.
  // After the `ret` the stack pointer is 16-byte aligned, as the call in fiber_start needs.
  const auto top = reinterpret_cast<std::uintptr_t>(f.stack_lo + f.stack_size) & ~std::uintptr_t{15};
  auto* w = reinterpret_cast<std::uint64_t*>(top);
  w[-1] = 0;
  w[-2] = 0;
  w[-3] = reinterpret_cast<std::uintptr_t>(&dsv4_sim_fiber_start);
  w[-4] = 0;                                                        // rbp
  w[-5] = 0;                                                        // rbx
  w[-6] = reinterpret_cast<std::uintptr_t>(&f);                     // r12
  w[-7] = reinterpret_cast<std::uintptr_t>(&dsv4_sim_fiber_main);  // r13
  w[-8] = 0;                                                        // r14
  w[-9] = 0;                                                        // r15
  f.context.sp = &w[-9];
#endif
}

inline void switch_context(Context& from, Context& to) {
#if defined(DSV4_SIM_UCONTEXT)
  swapcontext(&from.uc, &to.uc);
#else
  dsv4_sim_switch(&from.sp, to.sp);
#endif
}

// Scheduler -> fiber f, until f waits, exits or fails.
void resume(Fiber& f) {
  Simulator& s = sim();
  s.current = &f;
  t_builtins = &f.builtins;
#if defined(DSV4_SIM_ASAN)
  __sanitizer_start_switch_fiber(&s.scheduler_fake_stack, f.stack_lo, f.stack_size);
#endif
  switch_context(s.scheduler, f.context);
#if defined(DSV4_SIM_ASAN)
  __sanitizer_finish_switch_fiber(s.scheduler_fake_stack, nullptr, nullptr);
#endif
  t_builtins = nullptr;
  s.current = nullptr;
}

// Fiber f -> scheduler. Returns when the scheduler resumes f; `final` when f never resumes.
void yield(Fiber& f, bool final = false) {
  Simulator& s = sim();
#if defined(DSV4_SIM_ASAN)
  __sanitizer_start_switch_fiber(final ? nullptr : &f.asan_fake_stack, s.scheduler_stack_bottom,
                                 s.scheduler_stack_size);
#else
  (void)final;
#endif
  switch_context(f.context, s.scheduler);
#if defined(DSV4_SIM_ASAN)
  __sanitizer_finish_switch_fiber(f.asan_fake_stack, &s.scheduler_stack_bottom, &s.scheduler_stack_size);
#endif
}

Fiber& current_fiber(const char* what) {
  Fiber* f = sim().current;
  if (f == nullptr) outside_kernel(what);
  return *f;
}

// Reports an error of the running fiber: aborts right here (kAbort, so a debugger shows the
// kernel's frames), or hands the report to the scheduler, which throws it (kThrow).
// The message comes from a callable so that every temporary string is gone before the fiber
// yields: its frames are never unwound in kThrow mode (LeakSanitizer would report the strings).
template <class MakeMessage>
[[noreturn]] void fiber_fail(Fiber& f, MakeMessage make_message) {
  Simulator& s = sim();
  s.failure = fmt::format("{}: {}: {}", launch_description(), thread_description(f), make_message());
  if (s.mode.load() == ErrorMode::kAbort) {
    std::fprintf(stderr, "dsv4 sim: %s\n", s.failure.c_str());
    std::fflush(stderr);
    std::abort();
  }
  f.state = State::kFailed;
  yield(f, /*final=*/true);
  std::abort();  // a failed fiber is never resumed
}

void deliver_copies(Fiber& f, bool all, unsigned before_group) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < f.copies.size(); ++i) {
    PendingCopy& c = f.copies[i];
    if (all || c.group < before_group) {
      std::memcpy(c.dst, c.bytes, sizeof(c.bytes));
    } else {
      f.copies[kept++] = c;
    }
  }
  f.copies.resize(kept);
}

// Blocks the running fiber at a warp collective until the scheduler releases it.
void wait_warp(const Collective& collective, unsigned mask, void* data, const Location& loc) {
  Fiber& f = current_fiber(collective.name);
  if (((mask >> f.lane) & 1u) == 0) {
    fiber_fail(f, [&] {
      return fmt::format("{} at {} with mask {:#010x}, which does not include the calling lane {}", collective.name,
                         format_location(loc), mask, f.lane);
    });
  }
  f.state = State::kWarp;
  f.collective = &collective;
  f.mask = mask;
  f.data = data;
  f.where = loc;
  yield(f);
}

}  // namespace
}  // namespace dsv4::gpu::sim

extern "C" void dsv4_sim_fiber_main(void* fiber) {
  using namespace dsv4::gpu::sim;
  auto& f = *static_cast<Fiber*>(fiber);
  Simulator& s = sim();
#if defined(DSV4_SIM_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &s.scheduler_stack_bottom, &s.scheduler_stack_size);
#endif
  try {
    s.launch->body(s.launch->context);
    f.state = State::kExited;
    deliver_copies(f, true, 0);
  } catch (...) {
    s.kernel_exception = std::current_exception();
    s.failure = fmt::format("{}: {}: the kernel threw an exception", launch_description(), thread_description(f));
    f.state = State::kFailed;
  }
  yield(f, /*final=*/true);
  std::abort();  // never resumed
}

namespace dsv4::gpu::sim {
namespace {

// ---------------------------------------------------------------------------------------------
// The scheduler
// ---------------------------------------------------------------------------------------------

// Releases every group of warp w's lanes that can be released: a lane's group is its mask minus
// the exited lanes, and it releases when all of them wait at the same collective with the same
// mask. Returns whether something was released.
bool release_warp(unsigned base, unsigned w, unsigned threads) {
  Simulator& s = sim();
  Fiber* lanes[32] = {};
  unsigned alive = 0, waiting = 0;
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned i = w * 32 + lane;
    if (i >= threads) break;
    Fiber* f = s.fibers[base + i].get();
    lanes[lane] = f;
    if (f->state != State::kExited) alive |= 1u << lane;
    if (f->state == State::kWarp) waiting |= 1u << lane;
  }
  bool released = false;
  unsigned candidates = waiting;
  while (candidates != 0) {
    const unsigned lane = static_cast<unsigned>(std::countr_zero(candidates));
    const Fiber& f = *lanes[lane];
    const unsigned group = f.mask & alive;
    bool ok = (group & ~waiting) == 0;
    for (unsigned rest = group; ok && rest != 0; rest &= rest - 1) {
      const Fiber& m = *lanes[std::countr_zero(rest)];
      ok = m.collective == f.collective && m.mask == f.mask;
    }
    if (!ok) {
      candidates &= ~(1u << lane);
      continue;
    }
    f.collective->resolve(lanes, group);
    for (unsigned rest = group; rest != 0; rest &= rest - 1) lanes[std::countr_zero(rest)]->state = State::kReady;
    waiting &= ~group;
    candidates &= ~group;
    released = true;
  }
  return released;
}

bool same_location(const Location& a, const Location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

// Releases the block barrier of the block whose threads are fibers base .. base + threads - 1
// when every thread of it that has not exited waits at it.
bool release_barrier(unsigned base, unsigned threads, unsigned exited) {
  Simulator& s = sim();
  unsigned waiting = 0;
  const Fiber* first = nullptr;
  for (unsigned i = base; i < base + threads; ++i) {
    const Fiber& f = *s.fibers[i];
    if (f.state != State::kBarrier) continue;
    ++waiting;
    if (first == nullptr) {
      first = &f;
    } else if (f.barrier_op != first->barrier_op || !same_location(f.where, first->where)) {
      // Everybody may not be here yet, but threads at two different barriers can never meet.
      raise_error(fmt::format("{}: barrier divergence: {} waits at {} but {} waits at {}", launch_description(),
                              thread_description(*first), wait_description(*first), thread_description(f),
                              wait_description(f)));
    }
  }
  if (waiting == 0 || waiting + exited != threads) return false;
  int count = 0;
  for (unsigned i = base; i < base + threads; ++i) {
    const Fiber& f = *s.fibers[i];
    if (f.state == State::kBarrier && f.pred != 0) ++count;
  }
  int result = 0;
  switch (first->barrier_op) {
    case BarrierOp::kSync:
      break;
    case BarrierOp::kCount:
      result = count;
      break;
    case BarrierOp::kAnd:
      result = count == static_cast<int>(waiting) ? 1 : 0;
      break;
    case BarrierOp::kOr:
      result = count > 0 ? 1 : 0;
      break;
  }
  for (unsigned i = base; i < base + threads; ++i) {
    Fiber& f = *s.fibers[i];
    if (f.state == State::kBarrier) {
      f.barrier_result = result;
      f.state = State::kReady;
    }
  }
  return true;
}

// Releases the cluster barrier when every thread of the cluster that has not exited waits at it.
bool release_cluster(unsigned fibers) {
  Simulator& s = sim();
  unsigned waiting = 0, live = 0;
  for (unsigned i = 0; i < fibers; ++i) {
    const Fiber& f = *s.fibers[i];
    if (f.state == State::kExited) continue;
    ++live;
    if (f.state == State::kCluster) ++waiting;
  }
  if (waiting == 0 || waiting != live) return false;
  for (unsigned i = 0; i < fibers; ++i) {
    Fiber& f = *s.fibers[i];
    if (f.state == State::kCluster) f.state = State::kReady;
  }
  return true;
}

// Releases every named barrier at which as many threads wait as it counts; more waiting, or
// threads waiting with different counts, is an error.
bool release_named(unsigned base, unsigned threads) {
  Simulator& s = sim();
  unsigned waiting[kNamedBarriers] = {};
  const Fiber* first[kNamedBarriers] = {};
  for (unsigned i = base; i < base + threads; ++i) {
    const Fiber& f = *s.fibers[i];
    if (f.state != State::kNamed) continue;
    const auto id = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(f.data));
    ++waiting[id];
    if (first[id] == nullptr) {
      first[id] = &f;
    } else if (first[id]->pred != f.pred) {
      raise_error(fmt::format("{}: {} waits at {} but {} waits at {}", launch_description(), thread_description(*first[id]),
                              wait_description(*first[id]), thread_description(f), wait_description(f)));
    }
  }
  bool released = false;
  for (unsigned id = 0; id < kNamedBarriers; ++id) {
    if (first[id] == nullptr) continue;
    const auto count = static_cast<unsigned>(first[id]->pred);
    if (waiting[id] > count) {
      raise_error(fmt::format("{}: {} threads wait at named barrier {}, which counts {}", launch_description(),
                              waiting[id], id, count));
    }
    if (waiting[id] < count) continue;
    for (unsigned i = base; i < base + threads; ++i) {
      Fiber& f = *s.fibers[i];
      if (f.state == State::kNamed && reinterpret_cast<std::uintptr_t>(f.data) == id) f.state = State::kReady;
    }
    released = true;
  }
  return released;
}

// Gives waiting setmaxnreg_inc calls their registers, in thread order, while the pool lasts.
bool release_registers(unsigned base, unsigned threads, BlockRun& block) {
  Simulator& s = sim();
  bool released = false;
  for (unsigned i = base; i < base + threads; ++i) {
    Fiber& f = *s.fibers[i];
    if (f.state != State::kRegisters || static_cast<unsigned>(f.pred) > block.free_registers) continue;
    block.free_registers -= static_cast<unsigned>(f.pred);
    f.registers += static_cast<unsigned>(f.pred);
    f.state = State::kReady;
    released = true;
  }
  return released;
}

// setmaxnreg is warpgroup-wide (.sync.aligned): every thread of a warpgroup must end with the
// same budget, or some of them skipped a call the others made.
void check_register_budgets(unsigned base, unsigned threads) {
  Simulator& s = sim();
  for (unsigned i = base; i < base + threads; ++i) {
    const Fiber& first = *s.fibers[base + (i - base) / 128 * 128];
    const Fiber& f = *s.fibers[i];
    if (f.registers != first.registers) {
      raise_error(fmt::format("{}: setmaxnreg is warpgroup-wide, but {} ended with {} registers and {} with {}",
                              launch_description(), thread_description(first), first.registers, thread_description(f),
                              f.registers));
    }
  }
}

// Nothing can run and nothing can be released: report divergent warp collectives, or a deadlock
// with where every thread waits.
[[noreturn]] void report_stuck(unsigned blocks, unsigned threads) {
  Simulator& s = sim();
  const unsigned warps = (threads + 31) / 32;
  for (unsigned base = 0; base < blocks * threads; base += threads) {
    for (unsigned w = 0; w < warps; ++w) {
      unsigned alive = 0, waiting = 0;
      for (unsigned lane = 0; lane < 32 && w * 32 + lane < threads; ++lane) {
        const Fiber& f = *s.fibers[base + w * 32 + lane];
        if (f.state != State::kExited) alive |= 1u << lane;
        if (f.state == State::kWarp) waiting |= 1u << lane;
      }
      for (unsigned rest = waiting; rest != 0; rest &= rest - 1) {
        const Fiber& f = *s.fibers[base + w * 32 + static_cast<unsigned>(std::countr_zero(rest))];
        const unsigned group = f.mask & alive;
        if ((group & ~waiting) != 0) continue;  // some lane of the group waits elsewhere: a deadlock
        for (unsigned others = group; others != 0; others &= others - 1) {
          const Fiber& m = *s.fibers[base + w * 32 + static_cast<unsigned>(std::countr_zero(others))];
          if (m.collective != f.collective || m.mask != f.mask) {
            raise_error(
                fmt::format("{}: divergent warp collectives in warp {}: lane {} waits at {} but lane {} waits at {}",
                            launch_description(), w, f.lane, wait_description(f), m.lane, wait_description(m)));
          }
        }
      }
    }
  }
  std::string report = fmt::format("{}: deadlock: no thread can continue. The threads wait at:", launch_description());
  for (unsigned base = 0; base < blocks * threads; base += threads) {
    if (blocks > 1) report += fmt::format("\n  block {}:", format_dim(s.fibers[base]->builtins.block_idx));
    unsigned begin = 0;
    while (begin < threads) {
      const std::string what = wait_description(*s.fibers[base + begin]);
      unsigned end = begin + 1;
      while (end < threads && wait_description(*s.fibers[base + end]) == what) ++end;
      const std::string threads_text =
          end - begin == 1 ? fmt::format("thread {}", begin) : fmt::format("threads {}-{}", begin, end - 1);
      const std::string warps_text = begin / 32 == (end - 1) / 32
                                         ? fmt::format("warp {}", begin / 32)
                                         : fmt::format("warps {}-{}", begin / 32, (end - 1) / 32);
      report += fmt::format("\n  {} ({}): {}", threads_text, warps_text, what);
      begin = end;
    }
  }
  report += "\n  (thread numbers are linear: x + y * blockDim.x + z * blockDim.x * blockDim.y)";
  raise_error(report);
}

// After a fiber stopped: surfaces its failure.
void check_failed(Fiber& f) {
  if (f.state != State::kFailed) return;
  Simulator& s = sim();
  if (s.kernel_exception) {
    std::exception_ptr e = std::exchange(s.kernel_exception, nullptr);
    std::rethrow_exception(e);
  }
  raise_error(s.failure);
}

// Runs the blocks of one cluster (launch.blocks) together until every thread exited.
void run_cluster(Launch& launch) {
  Simulator& s = sim();
  const unsigned threads = launch.threads, blocks = launch.cluster, fibers = threads * blocks;
  s.mbarriers.clear();
  const unsigned registers = std::min(255u, 65536u / ((threads + 31) / 32 * 32)) / 8 * 8;
  for (BlockRun& b : launch.blocks) {
    std::memset(b.smem, 0xff, launch.smem_capacity);
    b.free_registers = 0;
    b.wgmma.clear();
  }
  for (unsigned j = 0; j < fibers; ++j) {
    Fiber& f = *s.fibers[j];
    const unsigned i = j % threads;
    f.builtins.thread_idx = uint3{i % launch.block.x, (i / launch.block.x) % launch.block.y,
                                  i / (launch.block.x * launch.block.y)};
    f.rank = j / threads;
    f.builtins.block_idx = launch.blocks[f.rank].block_idx;
    f.builtins.block_dim = launch.block;
    f.builtins.grid_dim = launch.grid;
    f.linear = i;
    f.warp = i / 32;
    f.lane = i % 32;
    f.state = State::kReady;
    f.collective = nullptr;
    f.data = nullptr;
    f.copies.clear();
    f.next_group = 0;
    f.wgmma_group = f.wgmma_in_group = f.wgmma_waited = 0;
    f.registers = registers;
    init_context(f);
  }

  const unsigned warps = (threads + 31) / 32;
  std::vector<unsigned> exited(blocks, 0);
  for (;;) {
    bool progress = false;
    for (unsigned r = 0; r < blocks; ++r) {
      const unsigned base = r * threads;
      for (unsigned w = 0; w < warps; ++w) {
        // Run the warp's lanes until none can run, release its collectives, repeat.
        for (;;) {
          for (unsigned i = w * 32; i < threads && i < (w + 1) * 32; ++i) {
            Fiber& f = *s.fibers[base + i];
            if (f.state != State::kReady) continue;
            resume(f);
            progress = true;
            check_failed(f);
            if (f.state == State::kExited) ++exited[r];
          }
          if (!release_warp(base, w, threads)) break;
          progress = true;
        }
      }
    }
    bool all_exited = true;
    for (unsigned r = 0; r < blocks; ++r) all_exited = all_exited && exited[r] == threads;
    if (all_exited) {
      for (unsigned r = 0; r < blocks; ++r) check_register_budgets(r * threads, threads);
      return;
    }
    bool released = false;
    for (unsigned r = 0; r < blocks; ++r) {
      const unsigned base = r * threads;
      released = release_barrier(base, threads, exited[r]) || released;
      released = release_named(base, threads) || released;
      released = release_registers(base, threads, launch.blocks[r]) || released;
    }
    released = release_cluster(fibers) || released;
    if (released) continue;
    if (!progress) report_stuck(blocks, threads);
  }
}

// ---------------------------------------------------------------------------------------------
// Collective kinds
// ---------------------------------------------------------------------------------------------
struct ShflRecord {
  std::uint64_t bits;
  int lane_arg;
  int width;
  ShflMode mode;
  std::uint64_t result;
};

// PTX shfl.sync: the segment of `width` lanes holding `lane` is [lane & ~(width-1), +width). idx
// reads lane_arg within the segment; up/down/xor read lane -/+/^ lane_arg and keep their own value
// when that falls outside the allowed range (below the segment for up, beyond its end otherwise).
unsigned shfl_source(ShflMode mode, unsigned lane, int lane_arg, int width) {
  const unsigned seg_mask = ~static_cast<unsigned>(width - 1) & 31u;
  const unsigned seg_start = lane & seg_mask;
  const unsigned seg_end = seg_start | (31u & ~seg_mask);
  const int b = lane_arg & 31;
  int j = static_cast<int>(lane);
  bool valid = true;
  switch (mode) {
    case ShflMode::kIdx:
      j = static_cast<int>(seg_start | (static_cast<unsigned>(b) & ~seg_mask));
      break;
    case ShflMode::kUp:
      j = static_cast<int>(lane) - b;
      valid = j >= static_cast<int>(seg_start);
      break;
    case ShflMode::kDown:
      j = static_cast<int>(lane) + b;
      valid = j <= static_cast<int>(seg_end);
      break;
    case ShflMode::kXor:
      j = static_cast<int>(lane ^ static_cast<unsigned>(b));
      valid = j <= static_cast<int>(seg_end);
      break;
  }
  return valid ? static_cast<unsigned>(j) : lane;
}

void resolve_shfl(Fiber* const* lanes, unsigned group) {
  for (unsigned rest = group; rest != 0; rest &= rest - 1) {
    const unsigned lane = static_cast<unsigned>(std::countr_zero(rest));
    auto& r = *static_cast<ShflRecord*>(lanes[lane]->data);
    const unsigned src = shfl_source(r.mode, lane, r.lane_arg, r.width);
    // A source lane that exited or is not in the mask: undefined in CUDA; 0 here.
    r.result = ((group >> src) & 1u) != 0 ? static_cast<ShflRecord*>(lanes[src]->data)->bits : 0;
  }
}

const Collective kShflIdx{"__shfl_sync", resolve_shfl};
const Collective kShflUp{"__shfl_up_sync", resolve_shfl};
const Collective kShflDown{"__shfl_down_sync", resolve_shfl};
const Collective kShflXor{"__shfl_xor_sync", resolve_shfl};

void resolve_nothing(Fiber* const*, unsigned) {}
const Collective kSyncwarp{"__syncwarp", resolve_nothing};

struct VoteRecord {
  VoteMode mode;
  int pred;
  unsigned result;
};
void resolve_vote(Fiber* const* lanes, unsigned group) {
  unsigned ballot = 0;
  for (unsigned rest = group; rest != 0; rest &= rest - 1) {
    const unsigned lane = static_cast<unsigned>(std::countr_zero(rest));
    if (static_cast<VoteRecord*>(lanes[lane]->data)->pred != 0) ballot |= 1u << lane;
  }
  for (unsigned rest = group; rest != 0; rest &= rest - 1) {
    auto& r = *static_cast<VoteRecord*>(lanes[std::countr_zero(rest)]->data);
    switch (r.mode) {
      case VoteMode::kBallot:
        r.result = ballot;
        break;
      case VoteMode::kAny:
        r.result = ballot != 0 ? 1 : 0;
        break;
      case VoteMode::kAll:
        r.result = ballot == group ? 1 : 0;
        break;
    }
  }
}
const Collective kBallot{"__ballot_sync", resolve_vote};
const Collective kAny{"__any_sync", resolve_vote};
const Collective kAll{"__all_sync", resolve_vote};

struct ReduceRecord {
  ReduceOp op;
  unsigned value;
  unsigned result;
};
void resolve_reduce(Fiber* const* lanes, unsigned group) {
  const ReduceOp op = static_cast<ReduceRecord*>(lanes[std::countr_zero(group)]->data)->op;
  unsigned acc = 0;
  bool first = true;
  for (unsigned rest = group; rest != 0; rest &= rest - 1) {
    const unsigned v = static_cast<ReduceRecord*>(lanes[std::countr_zero(rest)]->data)->value;
    if (first) {
      acc = v;
      first = false;
      continue;
    }
    switch (op) {
      case ReduceOp::kAdd:
        acc += v;
        break;
      case ReduceOp::kMinU:
        acc = v < acc ? v : acc;
        break;
      case ReduceOp::kMaxU:
        acc = v > acc ? v : acc;
        break;
      case ReduceOp::kMinS:
        acc = static_cast<int>(v) < static_cast<int>(acc) ? v : acc;
        break;
      case ReduceOp::kMaxS:
        acc = static_cast<int>(v) > static_cast<int>(acc) ? v : acc;
        break;
      case ReduceOp::kAnd:
        acc &= v;
        break;
      case ReduceOp::kOr:
        acc |= v;
        break;
      case ReduceOp::kXor:
        acc ^= v;
        break;
    }
  }
  for (unsigned rest = group; rest != 0; rest &= rest - 1) {
    static_cast<ReduceRecord*>(lanes[std::countr_zero(rest)]->data)->result = acc;
  }
}
const Collective kReduceAdd{"__reduce_add_sync", resolve_reduce};
const Collective kReduceMinU{"__reduce_min_sync(unsigned)", resolve_reduce};
const Collective kReduceMaxU{"__reduce_max_sync(unsigned)", resolve_reduce};
const Collective kReduceMinS{"__reduce_min_sync(int)", resolve_reduce};
const Collective kReduceMaxS{"__reduce_max_sync(int)", resolve_reduce};
const Collective kReduceAnd{"__reduce_and_sync", resolve_reduce};
const Collective kReduceOr{"__reduce_or_sync", resolve_reduce};
const Collective kReduceXor{"__reduce_xor_sync", resolve_reduce};

struct MatchRecord {
  std::uint64_t value;
  unsigned result;
  int all_equal;
};
void resolve_match(Fiber* const* lanes, unsigned group) {
  bool all_equal = true;
  const std::uint64_t first = static_cast<MatchRecord*>(lanes[std::countr_zero(group)]->data)->value;
  for (unsigned rest = group; rest != 0; rest &= rest - 1) {
    auto& r = *static_cast<MatchRecord*>(lanes[std::countr_zero(rest)]->data);
    if (r.value != first) all_equal = false;
    r.result = 0;
    for (unsigned others = group; others != 0; others &= others - 1) {
      const unsigned m = static_cast<unsigned>(std::countr_zero(others));
      if (static_cast<MatchRecord*>(lanes[m]->data)->value == r.value) r.result |= 1u << m;
    }
  }
  for (unsigned rest = group; rest != 0; rest &= rest - 1) {
    static_cast<MatchRecord*>(lanes[std::countr_zero(rest)]->data)->all_equal = all_equal ? 1 : 0;
  }
}
const Collective kMatchAny{"__match_any_sync", resolve_match};
const Collective kMatchAll{"__match_all_sync", resolve_match};

// ---- mma ----
struct MmaRecord {
  const std::uint32_t* a;
  const std::uint32_t* b;
  const float* c;
  float* d;
};

// e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals; 0x7f/0xff are NaN; no inf.
float decode_e4m3(unsigned code) {
  const unsigned exponent = (code >> 3) & 15u, mantissa = code & 7u;
  if (exponent == 15u && mantissa == 7u) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(static_cast<float>(8u + mantissa), static_cast<int>(exponent) - 10);
  return (code & 0x80u) != 0 ? -magnitude : magnitude;
}

float decode_bf16(unsigned bits) { return std::bit_cast<float>((bits & 0xffffu) << 16); }

// Gathers A (16 x K, row-major), B (K x 8) and C (16 x 8) from the fragments, computes D and
// scatters it. kBytesPerElement 1: m16n8k32 e4m3; 2: m16n8k16 bf16.
template <int K, int kElemsPerReg>
void resolve_mma(Fiber* const* lanes, unsigned group) {
  if (group != kFullMask) {
    raise_error(fmt::format("{}: mma.sync needs all 32 lanes of the warp; lanes {:#010x} have exited",
                            launch_description(), ~group));
  }
  float A[16][K], B[K][8], C[16][8];
  constexpr int kBits = 32 / kElemsPerReg;
  auto decode = [](unsigned code) { return kElemsPerReg == 4 ? decode_e4m3(code) : decode_bf16(code); };
  for (unsigned lane = 0; lane < 32; ++lane) {
    const auto& r = *static_cast<MmaRecord*>(lanes[lane]->data);
    const int g = static_cast<int>(lane >> 2), t = static_cast<int>(lane & 3u);
    for (int reg = 0; reg < 4; ++reg) {
      // a[reg]: rows g (+8 for odd registers), k from kElemsPerReg * t (+K/2 for registers 2, 3).
      const int row = g + ((reg & 1) ? 8 : 0);
      const int k0 = kElemsPerReg * t + ((reg & 2) ? K / 2 : 0);
      for (int e = 0; e < kElemsPerReg; ++e) {
        A[row][k0 + e] = decode((r.a[reg] >> (kBits * e)) & ((1u << kBits) - 1u));
      }
    }
    for (int reg = 0; reg < 2; ++reg) {
      const int k0 = kElemsPerReg * t + (reg ? K / 2 : 0);
      for (int e = 0; e < kElemsPerReg; ++e) B[k0 + e][g] = decode((r.b[reg] >> (kBits * e)) & ((1u << kBits) - 1u));
    }
    for (int i = 0; i < 4; ++i) C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)] = r.c[i];
  }
  float D[16][8];
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      float acc = C[m][n];
      for (int k = 0; k < K; ++k) acc += A[m][k] * B[k][n];  // each product is exact in fp32
      D[m][n] = acc;
    }
  }
  for (unsigned lane = 0; lane < 32; ++lane) {
    const auto& r = *static_cast<MmaRecord*>(lanes[lane]->data);
    const int g = static_cast<int>(lane >> 2), t = static_cast<int>(lane & 3u);
    for (int i = 0; i < 4; ++i) r.d[i] = D[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)];
  }
}
const Collective kMmaE4m3{"mma.sync.m16n8k32.e4m3", resolve_mma<32, 4>};
const Collective kMmaBf16{"mma.sync.m16n8k16.bf16", resolve_mma<16, 2>};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The public entry points
// ---------------------------------------------------------------------------------------------
void set_error_mode(ErrorMode mode) { sim().mode.store(mode); }
ErrorMode error_mode() { return sim().mode.load(); }

void outside_kernel(const char* what) {
  raise_error(fmt::format("{} used outside a simulated kernel (host code, or a kernel called directly "
                          "instead of through gpu::launch)",
                          what));
}

int block_barrier(BarrierOp op, int pred, const Location& loc) {
  Fiber& f = current_fiber(barrier_name(op));
  f.state = State::kBarrier;
  f.barrier_op = op;
  f.pred = pred;
  f.where = loc;
  yield(f);
  return f.barrier_result;
}

void syncwarp(unsigned mask, const Location& loc) { wait_warp(kSyncwarp, mask, nullptr, loc); }

void setmaxnreg(unsigned regs, bool increase, const Location& loc) {
  Fiber& f = current_fiber(increase ? "setmaxnreg_inc" : "setmaxnreg_dec");
  if (increase ? regs < f.registers : regs > f.registers) {
    fiber_fail(f, [&] {
      return fmt::format("{} at {}: {} registers a thread, but the thread has {}", increase ? "setmaxnreg_inc" : "setmaxnreg_dec",
                         format_location(loc), regs, f.registers);
    });
  }
  if (!increase) {
    sim().launch->blocks[f.rank].free_registers += f.registers - regs;
    f.registers = regs;
    return;
  }
  f.state = State::kRegisters;
  f.pred = static_cast<int>(regs - f.registers);
  f.where = loc;
  yield(f);
}

void vector_load(void* dst, const void* gmem, unsigned bytes, const Location& loc) {
  Fiber& f = current_fiber("a vector load");
  if ((reinterpret_cast<std::uintptr_t>(gmem) & (bytes - 1)) != 0) {
    fiber_fail(f, [&] {
      return fmt::format("{}-byte load at {}: global address {} must be {}-byte aligned", bytes, format_location(loc),
                         gmem, bytes);
    });
  }
  std::memcpy(dst, gmem, bytes);
}

void named_barrier_sync(unsigned id, unsigned threads, const Location& loc) {
  Fiber& f = current_fiber("named_barrier_sync");
  const unsigned block = sim().launch->threads;
  if (id == 0 || id >= kNamedBarriers || threads == 0 || threads % 32 != 0 || threads > block) {
    fiber_fail(f, [&] {
      return fmt::format("named_barrier_sync at {}: barrier {} must be 1..{} (0 is __syncthreads') and its count {} a "
                         "positive multiple of 32 up to the block's {} threads",
                         format_location(loc), id, kNamedBarriers - 1, threads, block);
    });
  }
  f.state = State::kNamed;
  f.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(id));
  f.pred = static_cast<int>(threads);
  f.where = loc;
  yield(f);
}

std::uint64_t shfl(ShflMode mode, unsigned mask, std::uint64_t bits, int lane_arg, int width, const Location& loc) {
  const Collective* kinds[] = {&kShflIdx, &kShflUp, &kShflDown, &kShflXor};
  const Collective& kind = *kinds[static_cast<int>(mode)];
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    fiber_fail(current_fiber(kind.name), [&] {
      return fmt::format("{} at {}: width {} is not a power of two in [1, 32]", kind.name, format_location(loc), width);
    });
  }
  ShflRecord record{bits, lane_arg, width, mode, 0};
  wait_warp(kind, mask, &record, loc);
  return record.result;
}

unsigned vote(VoteMode mode, unsigned mask, int pred, const Location& loc) {
  const Collective* kinds[] = {&kBallot, &kAny, &kAll};
  VoteRecord record{mode, pred, 0};
  wait_warp(*kinds[static_cast<int>(mode)], mask, &record, loc);
  return record.result;
}

unsigned reduce(ReduceOp op, unsigned mask, unsigned value, const Location& loc) {
  const Collective* kinds[] = {&kReduceAdd, &kReduceMinU, &kReduceMaxU, &kReduceMinS,
                               &kReduceMaxS, &kReduceAnd,  &kReduceOr,   &kReduceXor};
  ReduceRecord record{op, value, 0};
  wait_warp(*kinds[static_cast<int>(op)], mask, &record, loc);
  return record.result;
}

unsigned match_any(unsigned mask, std::uint64_t value, const Location& loc) {
  MatchRecord record{value, 0, 0};
  wait_warp(kMatchAny, mask, &record, loc);
  return record.result;
}

unsigned match_all(unsigned mask, std::uint64_t value, int* pred, const Location& loc) {
  MatchRecord record{value, 0, 0};
  wait_warp(kMatchAll, mask, &record, loc);
  if (pred != nullptr) *pred = record.all_equal;
  return record.all_equal ? record.result : 0u;
}

void mma_m16n8k32_e4m3(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2], const float (&c)[4],
                       const Location& loc) {
  MmaRecord record{a, b, c, d};
  wait_warp(kMmaE4m3, kFullMask, &record, loc);
}

void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2], const float (&c)[4],
                       const Location& loc) {
  MmaRecord record{a, b, c, d};
  wait_warp(kMmaBf16, kFullMask, &record, loc);
}

void cp_async_16(void* smem, const void* gmem, bool valid, const Location& loc) {
  Fiber& f = current_fiber("cp_async_16");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) != 0; };
  if (misaligned(smem) || (valid && misaligned(gmem))) {
    fiber_fail(f, [&] {
      return fmt::format("cp_async_16 at {}: addresses must be 16-byte aligned (shared {}, global {})",
                         format_location(loc), smem, gmem);
    });
  }
  PendingCopy copy{static_cast<unsigned char*>(smem), f.next_group, {}};
  if (valid) std::memcpy(copy.bytes, gmem, sizeof(copy.bytes));
  f.copies.push_back(copy);
}

void cp_async_commit() { ++current_fiber("cp_async_commit").next_group; }

void cp_async_wait(int pending_groups) {
  Fiber& f = current_fiber("cp_async_wait");
  if (pending_groups < 0) {
    deliver_copies(f, true, 0);
    return;
  }
  // Committed groups are 0 .. next_group-1; the newest `pending_groups` of them may stay pending.
  const unsigned n = static_cast<unsigned>(pending_groups);
  deliver_copies(f, false, f.next_group >= n ? f.next_group - n : 0);
}

namespace {

Mbarrier& mbarrier_of(Fiber& f, const std::uint64_t* bar, const char* what, const Location& loc) {
  auto it = sim().mbarriers.find(bar);
  if (it == sim().mbarriers.end()) {
    fiber_fail(f, [&] {
      return fmt::format("{} at {}: barrier {} was not initialized in this block", what, format_location(loc),
                         static_cast<const void*>(bar));
    });
  }
  return it->second;
}

// Completes the current phase when nothing is outstanding: the copies land, waiters of the phase
// run again, and the next phase expects the same arrivals.
void try_complete(Mbarrier& m, const std::uint64_t* bar) {
  if (m.pending != 0 || m.tx != 0) return;
  for (PendingBulk& c : m.copies) m.completed.push_back(std::move(c));
  m.copies.clear();
  const unsigned parity = m.phase & 1u;
  ++m.phase;
  m.pending = m.expected;
  Simulator& s = sim();
  for (unsigned i = 0; i < s.launch->threads * s.launch->cluster; ++i) {
    Fiber& w = *s.fibers[i];
    if (w.state == State::kMbarrier && w.data == bar && static_cast<unsigned>(w.pred) == parity)
      w.state = State::kReady;
  }
}

}  // namespace

void mbarrier_init(std::uint64_t* bar, unsigned count, const Location& loc) {
  Fiber& f = current_fiber("mbarrier_init");
  if ((reinterpret_cast<std::uintptr_t>(bar) & 7u) != 0 || count == 0) {
    fiber_fail(f, [&] {
      return fmt::format("mbarrier_init at {}: barrier {} must be 8-byte aligned, count {} positive",
                         format_location(loc), static_cast<void*>(bar), count);
    });
  }
  Mbarrier& m = sim().mbarriers[bar];
  m = Mbarrier{};
  m.expected = m.pending = count;
  *bar = 0;
}

void mbarrier_arrive(std::uint64_t* bar, unsigned tx_bytes, const Location& loc) {
  Fiber& f = current_fiber("mbarrier_arrive");
  Mbarrier& m = mbarrier_of(f, bar, "mbarrier_arrive", loc);
  if (m.pending == 0) {
    fiber_fail(f, [&] {
      return fmt::format("mbarrier_arrive at {}: more arrivals than the barrier's count {}", format_location(loc),
                         m.expected);
    });
  }
  m.tx += tx_bytes;
  --m.pending;
  try_complete(m, bar);
}

void bulk_copy_to_shared(void* smem, const void* gmem, unsigned bytes, std::uint64_t* bar, const Location& loc) {
  Fiber& f = current_fiber("bulk_copy_to_shared");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) != 0; };
  if (misaligned(smem) || misaligned(gmem) || bytes == 0 || bytes % 16 != 0) {
    fiber_fail(f, [&] {
      return fmt::format(
          "bulk_copy_to_shared at {}: addresses must be 16-byte aligned and the size a positive multiple of 16 (shared "
          "{}, global {}, {} bytes)",
          format_location(loc), smem, gmem, bytes);
    });
  }
  Mbarrier& m = mbarrier_of(f, bar, "bulk_copy_to_shared", loc);
  PendingBulk c{static_cast<unsigned char*>(smem), std::vector<unsigned char>(bytes)};
  std::memcpy(c.bytes.data(), gmem, bytes);
  m.copies.push_back(std::move(c));
  m.tx -= bytes;  // the copy's bytes complete (the arrival that expects them may come later)
  try_complete(m, bar);
}

void mbarrier_wait(std::uint64_t* bar, unsigned parity, const Location& loc) {
  Fiber& f = current_fiber("mbarrier_wait");
  Mbarrier& m = mbarrier_of(f, bar, "mbarrier_wait", loc);
  if ((m.phase & 1u) == (parity & 1u)) {  // the phase of that parity has not completed: sleep
    f.state = State::kMbarrier;
    f.data = bar;
    f.pred = static_cast<int>(parity & 1u);
    f.where = loc;
    yield(f);
  }
  // The wait saw every completed phase: their copies land now.
  for (const PendingBulk& c : m.completed) std::memcpy(c.dst, c.bytes.data(), c.bytes.size());
  m.completed.clear();
}

namespace {

// A checksum of the core matrices an operand descriptor names: `row_groups` 8-row groups (sbo
// apart) times the two 8-value K groups of a k16 product (lbo apart), 128 bytes each.
std::uint64_t operand_sum(std::uint64_t desc, int row_groups) {
  const std::uint64_t start = (desc & 0x3FFFu) << 4, lbo = ((desc >> 16) & 0x3FFFu) << 4, sbo = ((desc >> 32) & 0x3FFFu) << 4;
  const unsigned char* smem = sim().launch->blocks[current_fiber("wgmma").rank].smem;
  std::uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < row_groups; ++i)
    for (int j = 0; j < 2; ++j) {
      const std::uint64_t at = start + static_cast<std::uint64_t>(i) * sbo + static_cast<std::uint64_t>(j) * lbo;
      if (at + 128 > sim().launch->smem_capacity) continue;  // out of range: the product's reads report it
      std::uint64_t w[16];
      std::memcpy(w, smem + at, sizeof(w));
      for (std::uint64_t x : w) h = (h ^ x) * 1099511628211ull;
    }
  return h;
}
std::uint64_t product_sum(const WgmmaProduct& p) {
  return (p.desc_a == kRegisterA ? 0 : operand_sum(p.desc_a, 8)) * 31 + operand_sum(p.desc_b, p.b_row_groups);
}

}  // namespace

void wgmma_issue(std::uint64_t desc_a, std::uint64_t desc_b, int b_row_groups, const Location& loc) {
  Fiber& f = current_fiber("wgmma");
  WgmmaProduct probe{desc_a, desc_b, b_row_groups, 0, 0, 0, loc};
  const std::uint64_t sum = product_sum(probe);
  WgmmaProduct& p = sim().launch->blocks[f.rank].wgmma[{f.linear / 128, f.wgmma_group, f.wgmma_in_group++}];
  if (p.issued == 0) {
    p = probe;
    p.sum = sum;
  } else if (p.sum != sum) {
    fiber_fail(f, [&] {
      return fmt::format("the operands of the wgmma product issued at {} changed between the warpgroup's threads' "
                         "issues (shared memory a product reads must not be written until its last wait)",
                         format_location(p.where));
    });
  }
  ++p.issued;
}

void wgmma_commit() {
  Fiber& f = current_fiber("wgmma_commit");
  ++f.wgmma_group;
  f.wgmma_in_group = 0;
}

void wgmma_wait(int pending_groups, const Location& loc) {
  Fiber& f = current_fiber("wgmma_wait");
  const unsigned keep = static_cast<unsigned>(pending_groups);
  const unsigned done = f.wgmma_group >= keep ? f.wgmma_group - keep : 0;
  Simulator& s = sim();
  const unsigned wg = f.linear / 128;
  const unsigned members = std::min(128u, s.launch->threads - wg * 128);
  auto& products = s.launch->blocks[f.rank].wgmma;
  for (; f.wgmma_waited < done; ++f.wgmma_waited) {
    for (unsigned k = 0;; ++k) {
      auto it = products.find({wg, f.wgmma_waited, k});
      if (it == products.end()) break;
      WgmmaProduct& p = it->second;
      if (++p.waited < members) continue;
      if (p.issued != members) {
        fiber_fail(f, [&] {
          return fmt::format("the wgmma product issued at {} was issued by {} of the warpgroup's {} threads (all of "
                             "them must issue it together)",
                             format_location(p.where), p.issued, members);
        });
      }
      if (product_sum(p) != p.sum) {
        fiber_fail(f, [&] {
          return fmt::format("the operands of the wgmma product issued at {} changed before the warpgroup's last "
                             "wgmma_wait (at {}): shared memory a product reads must not be written until then",
                             format_location(p.where), format_location(loc));
        });
      }
      products.erase(it);
    }
  }
}

unsigned cluster_rank(const Location&) { return current_fiber("cluster_rank").rank; }

unsigned cluster_blocks(const Location&) {
  current_fiber("cluster_blocks");
  return sim().launch->cluster;
}

void cluster_sync(const Location& loc) {
  Fiber& f = current_fiber("cluster_sync");
  f.state = State::kCluster;
  f.where = loc;
  yield(f);
}

void* cluster_map(const void* smem, unsigned rank, const Location& loc) {
  Fiber& f = current_fiber("cluster_map");
  const Launch& l = *sim().launch;
  const auto* p = static_cast<const unsigned char*>(smem);
  const unsigned char* own = l.blocks[f.rank].smem;
  if (rank >= l.cluster || p < own || p >= own + l.smem_capacity) {
    fiber_fail(f, [&] {
      return fmt::format(
          "cluster_map at {}: rank {} of a cluster of {} blocks, address {} (it must be into the "
          "block's dynamic shared memory, {} bytes at {})",
          format_location(loc), rank, l.cluster, smem, l.smem_capacity, static_cast<const void*>(own));
    });
  }
  return l.blocks[rank].smem + (p - own);
}

void mbarrier_arrive_remote(std::uint64_t* bar, unsigned rank, const Location& loc) {
  mbarrier_arrive(static_cast<std::uint64_t*>(cluster_map(bar, rank, loc)), 0, loc);
}

unsigned char* dynamic_smem() {
  Simulator& s = sim();
  if (s.launch == nullptr || s.current == nullptr) outside_kernel("dynamic shared memory");
  return s.launch->blocks[s.current->rank].smem;
}

void device_assert_failed(const char* condition, const char* file, int line) {
  fiber_fail(current_fiber("DSV4_DEVICE_ASSERT"),
             [&] { return fmt::format("device assertion `{}` failed at {}:{}", condition, file, line); });
}

void trap(const Location& loc) {
  fiber_fail(current_fiber("__trap"), [&] { return fmt::format("__trap() at {}", format_location(loc)); });
}

void set_max_dynamic_smem(KernelId kernel, std::size_t bytes) {
  if (bytes > kOptinSmemLimit) {
    fail("cudaFuncSetAttribute(MaxDynamicSharedMemorySize = {}) failed for {}: invalid argument (the simulated "
         "H200 allows at most {} bytes)",
         bytes, kernel_name(kernel), kOptinSmemLimit);
  }
  Simulator& s = sim();
  std::lock_guard lock(s.attribute_mutex);
  s.max_dynamic_smem[kernel] = bytes;
}

void run_grid(const LaunchRequest& request) {
  Simulator& s = sim();
  auto refuse = [&](const std::string& why) {
    fail("kernel launch failed: {} with grid {}, block {}, {} bytes of dynamic shared memory: {} (simulated)",
         kernel_name(request.kernel), format_dim(request.grid), format_dim(request.block), request.smem_bytes, why);
  };
  if (t_builtins != nullptr) refuse("launch from inside a kernel (dynamic parallelism) is not simulated");
  const dim3 g = request.grid, b = request.block;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
      std::uint64_t{b.x} * b.y * b.z > kMaxThreads) {
    refuse("invalid configuration argument (block size)");
  }
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
    refuse("invalid configuration argument (grid size)");
  }
  if (request.smem_bytes > kDefaultSmemLimit) {
    std::size_t limit = kDefaultSmemLimit;
    {
      std::lock_guard lock(s.attribute_mutex);
      auto it = s.max_dynamic_smem.find(request.kernel);
      if (it != s.max_dynamic_smem.end()) limit = std::max(limit, it->second);
    }
    if (request.smem_bytes > limit) {
      refuse(fmt::format("invalid argument: more than the kernel's limit of {} bytes (above 48 KB, call "
                         "gpu::set_max_dynamic_smem first; at most {} bytes)",
                         limit, kOptinSmemLimit));
    }
  }

  const unsigned cluster = request.cluster;
  if (cluster == 0 || cluster > 8 || g.x % cluster != 0)
    refuse(fmt::format("invalid cluster of {} blocks (1 to 8, dividing the grid's x dimension {})", cluster, g.x));

  std::lock_guard lock(s.launch_mutex);
  const unsigned threads = b.x * b.y * b.z;
  while (s.fibers.size() < threads * cluster) {
    auto f = std::make_unique<Fiber>();
    allocate_stack(*f);
    s.fibers.push_back(std::move(f));
  }
  Launch launch{request.kernel, g, b, threads, request.smem_bytes, request.body, request.context, cluster, {}, 0};
  launch.smem_capacity = (std::max<std::size_t>(request.smem_bytes, 1) + 127) / 128 * 128;
  std::vector<std::unique_ptr<unsigned char, void (*)(void*)>> smem;
  launch.blocks.resize(cluster);
  for (unsigned r = 0; r < cluster; ++r) {
    smem.emplace_back(static_cast<unsigned char*>(std::aligned_alloc(128, launch.smem_capacity)), std::free);
    if (!smem.back()) refuse("cannot allocate the simulated shared memory");
    launch.blocks[r].smem = smem.back().get();
  }

  struct Reset {
    ~Reset() {
      Simulator& sm = sim();
      sm.launch = nullptr;
      sm.current = nullptr;
      sm.kernel_exception = nullptr;
      t_builtins = nullptr;
    }
  } reset;
  s.launch = &launch;
  for (unsigned z = 0; z < g.z; ++z) {
    for (unsigned y = 0; y < g.y; ++y) {
      for (unsigned x = 0; x < g.x; x += cluster) {
        for (unsigned r = 0; r < cluster; ++r) launch.blocks[r].block_idx = uint3{x + r, y, z};
        run_cluster(launch);
      }
    }
  }
}

}  // namespace dsv4::gpu::sim

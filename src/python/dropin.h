// kpack._kpack.DropIn: the C half of kpack's drop-in for Triton's `kernel[grid](...)`
// (kpack/_dropin.py installs it as triton's KernelInterface.__getitem__).
//
// `DropIn(resolver, original)` is a method descriptor: `fn[grid]` on any Triton kernel
// object calls it with (fn, grid), and it returns a launcher that, called with the
// kernel's arguments, launches a kpack kernel object -- or calls `original(fn, grid)`
// (Triton's own `__getitem__`, so its JIT) with the same arguments when the pack cannot
// serve the call. Everything that needs judgement is asked of `resolver` (Python), once:
//
//   resolver.function(fn) -> None (not a kernel the drop-in handles: pass through,
//       uncounted) | (info, reason or None, pre_run_hooks list)
//   resolver.shape(info, nargs, kwnames) -> reason str | (shape, key_positions,
//       call_positions, defaults, dtype_params): how a call with `nargs` positional
//       arguments and these keyword names binds -- the vectorcall positions whose values
//       make the key (constexprs and launch options given at the call), per kpack call
//       parameter the vectorcall position it comes from or -1-d for defaults[d], and the
//       call parameters whose tensor dtype joins the key
//   resolver.target(info, shape, values, dtypes) -> kernel object | reason str
//   resolver.fallback(info, reason) -> None (warns once, counts), or raises (strict)
//
// and cached per (function, call shape, key): a call that repeats a function, a call
// shape and the key values launches with no Python frame -- a hash lookup, the key
// compared with the last one, the tensors' dtypes read through their DLPack exchange
// table, then kpack's eager launch (kernel.h: LaunchObjects). The GIL guards all of it.
// A dtype is DLPack's (code << 8 | bits), 0 for an argument that is not a tensor read
// through the exchange table, 0xFFFF for None: the target the resolver gives for a None
// has that parameter as a constexpr None, and the argument is left out of the launch.

#ifndef KPACK_SRC_PYTHON_DROPIN_H_
#define KPACK_SRC_PYTHON_DROPIN_H_

#include <nanobind/nanobind.h>

namespace kpack::python {

// Registers kpack._kpack.DropIn in `m`.
void InitDropIn(nanobind::module_& m);

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_DROPIN_H_

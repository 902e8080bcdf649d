// How the extension's callable types are made, and why two ways.
//
// Long-lived objects that are called to launch (kpack.Kernel, kpack.BoundLaunch,
// kpack.DropIn) are nanobind classes, like the rest of the extension: their methods,
// properties, construction, lifetime and garbage-collector support are nanobind's. Only
// the call itself is hand-written: a vectorcall function (PEP 590) whose pointer lives in
// the C++ object, which CPython finds at a fixed offset in the Python instance. So a call
// converts its arguments straight from the caller's array, with no argument tuple,
// keyword dict or nanobind overload dispatch. VectorcallClassSlots and
// FinishVectorcallClass set that up; Self<T> finds the C++ object in the call.
//
// Per-call objects (kernel[grid] -> kpack.GridLaunch, and the drop-in's fn[grid]) are made
// on every launch of that form, so they are minimal hand-written CPython types
// (MakeLaunchType): making a nanobind instance costs a registration in nanobind's
// instance table and its removal on destruction, which that launch path cannot afford.

#ifndef KPACK_SRC_PYTHON_VECTORCALL_H_
#define KPACK_SRC_PYTHON_VECTORCALL_H_

#include <Python.h>
#include <nanobind/nanobind.h>

#include <cstddef>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

namespace kpack::python {

// Where nanobind puts the C++ object of a nanobind instance it allocated (internal
// storage): right after its 24-byte instance header (PyObject plus offset and state
// words), aligned for T. FinishVectorcallClass checks this against nanobind at import.
template <typename T>
inline constexpr Py_ssize_t kInstanceOffset =
    (static_cast<Py_ssize_t>(sizeof(PyObject) + 8) + alignof(T) - 1) /
    static_cast<Py_ssize_t>(alignof(T)) * static_cast<Py_ssize_t>(alignof(T));

// The C++ object of `o`, an instance of a class finished by FinishVectorcallClass for T.
template <typename T>
inline T* Self(PyObject* o) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(o) + kInstanceOffset<T>);
}

// nb::type_slots for a class of T, which starts with `vectorcallfunc vectorcall`: `extra`
// plus the __vectorcalloffset__ member and tp_call. The array lives as long as the
// process (nanobind and CPython keep pointers into it).
const PyType_Slot* VectorcallClassSlots(Py_ssize_t vectorcall_offset,
                                        std::initializer_list<PyType_Slot> extra);
template <typename T>
const PyType_Slot* VectorcallClassSlots(std::initializer_list<PyType_Slot> extra) {
  // T's first member (no base class, no virtual function: at offset 0).
  static_assert(std::is_same_v<decltype(T::vectorcall), vectorcallfunc>);
  static_assert(!std::is_polymorphic_v<T>);
  return VectorcallClassSlots(kInstanceOffset<T>, extra);
}

// After nb::class_<T> made `type` with those slots: turns vectorcall on (the flag a type
// spec cannot carry through nanobind), adds `extra_flags` (e.g.
// Py_TPFLAGS_METHOD_DESCRIPTOR), and checks that nanobind stores T at kInstanceOffset<T>.
// Throws std::runtime_error (an ImportError) if not.
void FinishVectorcallClass(nanobind::handle type, Py_ssize_t instance_offset,
                           unsigned long extra_flags = 0);  // NOLINT(runtime/int)
template <typename T>
void FinishVectorcallClass(nanobind::handle type, unsigned long extra_flags = 0) {  // NOLINT
  FinishVectorcallClass(type, kInstanceOffset<T>, extra_flags);
}

// A hand-written per-call type: GC-tracked, vectorcall at `vectorcall_offset` (also its
// tp_call), `slots` besides, not instantiable from Python. Null with a Python exception
// set.
PyTypeObject* MakeLaunchType(const char* name, int basicsize, Py_ssize_t vectorcall_offset,
                             std::vector<PyType_Slot> slots, const char* doc);

// The same for a type T laid out as PyObject_HEAD, `vectorcallfunc vectorcall`, and two
// strong references: `*kOwner` (what it launches through; kept until it dies) and
// `*kExtra` (may be null; what the garbage collector clears to break a cycle). `slots`
// adds the rest (repr, methods).
template <typename T, PyObject* T::*kOwner, PyObject* T::*kExtra>
struct LaunchObjectGC {
  static int Traverse(PyObject* self, visitproc visit, void* arg) {
    T* o = reinterpret_cast<T*>(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(o->*kOwner);
    Py_VISIT(o->*kExtra);
    return 0;
  }
  static int Clear(PyObject* self) {
    Py_CLEAR(reinterpret_cast<T*>(self)->*kExtra);
    return 0;
  }
  static void Dealloc(PyObject* self) {
    T* o = reinterpret_cast<T*>(self);
    PyTypeObject* type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Py_CLEAR(o->*kExtra);
    Py_CLEAR(o->*kOwner);
    PyObject_GC_Del(self);
    Py_DECREF(type);
  }
};
template <typename T, PyObject* T::*kOwner, PyObject* T::*kExtra>
PyTypeObject* MakeLaunchType(const char* name, std::vector<PyType_Slot> slots, const char* doc) {
  using GC = LaunchObjectGC<T, kOwner, kExtra>;
  slots.push_back({Py_tp_dealloc, reinterpret_cast<void*>(GC::Dealloc)});
  slots.push_back({Py_tp_traverse, reinterpret_cast<void*>(GC::Traverse)});
  slots.push_back({Py_tp_clear, reinterpret_cast<void*>(GC::Clear)});
  return MakeLaunchType(name, sizeof(T), offsetof(T, vectorcall), std::move(slots), doc);
}

// A nanobind method's *args and **kwargs in vectorcall form (positional objects, then the
// keyword values in the order of `kwnames`), for the hand-written call paths that bind,
// select_variant and friends share with the launch.
class VectorcallArgs {
 public:
  VectorcallArgs(const nanobind::args& args, const nanobind::kwargs& kwargs);
  PyObject* const* data() const { return objects_.data(); }
  size_t nargs() const { return nargs_; }
  PyObject* kwnames() const { return kwnames_.is_valid() ? kwnames_.ptr() : nullptr; }

 private:
  std::vector<PyObject*> objects_;  // borrowed from args and kwargs
  size_t nargs_ = 0;
  nanobind::object kwnames_;  // a tuple of str, or null
};

}  // namespace kpack::python

#endif  // KPACK_SRC_PYTHON_VECTORCALL_H_

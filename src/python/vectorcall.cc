// Vectorcall slots for nanobind classes, and the per-call launch types; see vectorcall.h.

#include "vectorcall.h"

#include <structmember.h>  // PyMemberDef, T_PYSSIZET (Python.h has them only from 3.12)

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace nb = nanobind;

namespace kpack::python {
namespace {

// A __vectorcalloffset__ member list, kept for the process's life.
const PyMemberDef* VectorcallMember(Py_ssize_t offset) {
  auto* members = new PyMemberDef[2];
  members[0] = {"__vectorcalloffset__", T_PYSSIZET, offset, READONLY, nullptr};
  members[1] = {nullptr, 0, 0, 0, nullptr};
  return members;
}

}  // namespace

const PyType_Slot* VectorcallClassSlots(Py_ssize_t vectorcall_offset,
                                        std::initializer_list<PyType_Slot> extra) {
  auto* slots = new PyType_Slot[extra.size() + 3];  // kept for the process's life
  size_t n = 0;
  for (const PyType_Slot& s : extra) slots[n++] = s;
  slots[n++] = {Py_tp_members, const_cast<PyMemberDef*>(VectorcallMember(vectorcall_offset))};
  slots[n++] = {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)};
  slots[n] = {0, nullptr};
  return slots;
}

void FinishVectorcallClass(nb::handle type, Py_ssize_t instance_offset,
                           unsigned long extra_flags) {  // NOLINT(runtime/int)
  auto* tp = reinterpret_cast<PyTypeObject*>(type.ptr());
  // A type spec made through nanobind cannot carry Py_TPFLAGS_HAVE_VECTORCALL; CPython
  // reads the flag on each call, and no instance exists yet.
  tp->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL | extra_flags;
  nb::object probe = nb::inst_alloc(type);  // never made ready: destroyed as raw memory
  const Py_ssize_t offset = reinterpret_cast<char*>(nb::inst_ptr<void>(probe)) -
                            reinterpret_cast<char*>(probe.ptr());
  if (offset != instance_offset || tp->tp_vectorcall_offset < instance_offset) {
    throw std::runtime_error(
        std::string("kpack: nanobind stores ") + tp->tp_name + " at offset " +
        std::to_string(offset) + ", not " + std::to_string(instance_offset) +
        " as src/python/vectorcall.h expects: this nanobind version is not supported");
  }
}

PyTypeObject* MakeLaunchType(const char* name, int basicsize, Py_ssize_t vectorcall_offset,
                             std::vector<PyType_Slot> slots, const char* doc) {
  slots.push_back({Py_tp_members, const_cast<PyMemberDef*>(VectorcallMember(vectorcall_offset))});
  slots.push_back({Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)});
  slots.push_back({Py_tp_doc, const_cast<char*>(doc)});
  slots.push_back({0, nullptr});
  PyType_Spec spec = {name, basicsize, 0,
                      static_cast<unsigned int>(Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
                                                Py_TPFLAGS_HAVE_VECTORCALL |
                                                Py_TPFLAGS_DISALLOW_INSTANTIATION),
                      slots.data()};
  return reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
}

VectorcallArgs::VectorcallArgs(const nb::args& args, const nb::kwargs& kwargs) {
  nargs_ = static_cast<size_t>(PyTuple_GET_SIZE(args.ptr()));
  objects_.reserve(nargs_ + static_cast<size_t>(PyDict_GET_SIZE(kwargs.ptr())));
  for (size_t i = 0; i < nargs_; ++i) {
    objects_.push_back(PyTuple_GET_ITEM(args.ptr(), static_cast<Py_ssize_t>(i)));
  }
  if (PyDict_GET_SIZE(kwargs.ptr()) == 0) return;
  kwnames_ = nb::steal(PyTuple_New(PyDict_GET_SIZE(kwargs.ptr())));
  if (!kwnames_.is_valid()) throw nb::python_error();
  Py_ssize_t pos = 0, k = 0;
  PyObject *key, *value;
  while (PyDict_Next(kwargs.ptr(), &pos, &key, &value)) {
    PyTuple_SET_ITEM(kwnames_.ptr(), k++, Py_NewRef(key));
    objects_.push_back(value);
  }
}

}  // namespace kpack::python

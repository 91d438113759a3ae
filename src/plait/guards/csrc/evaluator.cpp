// The native guard evaluator: the extension module _plait_guards, built and loaded by
// plait.guards.native (with the system C++ compiler, against PyTorch's headers). Two types:
//
// * Evaluator(ops): called with a plait.guards GuardEnv, runs the ops in order and returns
//   whether every one holds, stopping at the first that fails. Each op is one guard
//   ((code, read, expected, *args)); what an op cannot decide natively (a tensor of a type other
//   than torch.Tensor/nn.Parameter, an error inside PyTorch) it decides with the guard's own
//   Python read, and counts it (python_reads).
//   A PYVALUES op given a re-arm callable takes new identity checks from it after its checks
//   failed and the Python read found the values unchanged (counted: rearms).
// * Fetcher(tables, keys): called with no argument, returns [tables[i][keys[i]] ...].
//
// Tensors are read through their TensorImpl (headers of the PyTorch it is built against); where
// the Python object keeps it is torch_layout.h's business, checked at configure() against
// Tensor._cdata.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <c10/core/TensorImpl.h>

#include "torch_layout.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

namespace {

using plait_layout::impl_of;  // torch_layout.h: where a tensor keeps its TensorImpl

PyObject* g_plain[4] = {nullptr, nullptr, nullptr, nullptr};  // types read natively
int g_nplain = 0;
PyObject* g_tensor_class = nullptr;  // torch.Tensor, for isinstance
getattrofunc g_hook_getattro = nullptr;  // tp_getattro of a Python class with __getattr__
PyObject* g_object_getattribute = nullptr;  // object.__getattribute__
PyObject* s_getattribute = nullptr;
bool g_configured = false;

inline bool plain(PyObject* o) {
  PyObject* t = reinterpret_cast<PyObject*>(Py_TYPE(o));
  for (int i = 0; i < g_nplain; ++i) {
    if (t == g_plain[i]) return true;
  }
  return false;
}

enum Result { HOLDS = 0, FAILS = 1, PYTHON = 2, ERROR = 3 };
enum Code {
  CALL = 0, CALL0 = 1, CALLS0 = 2, STRUCTURE = 3, TENSORS = 4, EDGES = 5, ATTRS = 6,
  LEAF_VALUE = 7, LEAF_IS = 8, LEAF_BITS = 9, PYVALUES = 10, IDENTITY = 11
};
// PYVALUES check kinds (plait.guards.guard.ReadPyValues)
enum PyKind {
  PK_ITEMS = 0, PK_CELL = 1, PK_FUNC = 2, PK_TYPE = 3, PK_DICT = 4, PK_LIST = 5, PK_PYTHON = 6,
  PK_TYPEATTRS = 7, PK_CALL = 8, PK_SET = 9
};

// One PYVALUES check; `seen` remembers the dict version (or type version tag) at which the
// check last held, so that an untouched dict costs one load.
struct PyCheck {
  int kind = PK_PYTHON;
  PyObject* a = nullptr;
  PyObject* b = nullptr;
  PyObject* c = nullptr;
  PyObject* d = nullptr;
  std::vector<PyObject*> keys, values;
  mutable uint64_t seen = 0;
  mutable bool valid = false;
};

// A PYVALUES op's checks; `owner` (owned, or nullptr where the op's tuple owns them) keeps
// alive the objects they borrow. Shared, so that a run holds the set it started with while a
// re-arm (a Python read in another thread may run between checks) installs another.
struct PyChecks {
  std::vector<PyCheck> checks;
  PyObject* owner = nullptr;
  ~PyChecks() { Py_XDECREF(owner); }  // NOTE: dropped with the GIL held (runs, clear)
};
enum Flag {
  F_ID = 1, F_VERSION = 2, F_PTR = 4, F_META = 8, F_SIZES = 16, F_GRAD = 32, F_SAMPLE = 64
};

struct TCheck {
  int where = 0;  // 0: env.leaves, 1: env.state
  Py_ssize_t index = 0;
  int flags = 0;
  uintptr_t id = 0;
  int64_t version = 0;
  uintptr_t ptr = 0;
  caffe2::TypeMeta dtype;
  c10::Device device{c10::kCPU};
  std::vector<int64_t> sizes;
  std::vector<char> wild;  // 1: a symbolic dim, any size
  bool grad = false;
  // F_SAMPLE (plait.guards.sampled): the strides the offsets hold for, the byte offsets from
  // the data pointer, the bytes read at each, the digest of what was read at freezing
  std::vector<int64_t> strides;
  std::vector<int64_t> offsets;
  int64_t size = 0;
  int64_t end = 0;  // NOTE: the last sampled byte's offset plus one (offsets are >= 0)
  uint64_t digest = 0;
};

// getattr(o, name) read from o's instance dict: valid while o's type is `type` and that type
// (or a base) was not modified since (its version tag; 0: no fast read).
struct AttrFast {
  PyTypeObject* type = nullptr;
  unsigned int tag = 0;
};

struct Op {
  int code = 0;
  bool exact = true;  // CALL0: false when fn() == expected only suffices (else: the read decides)
  Py_ssize_t index = 0;
  int64_t bits = 0;  // LEAF_BITS: the expected float's IEEE-754 bits
  PyObject* tuple = nullptr;  // the op as given (owns every object below)
  PyObject* read = nullptr;
  PyObject* expected = nullptr;
  PyObject* a = nullptr;
  std::vector<PyObject*> xs, ys, zs;
  std::vector<TCheck> checks;
  std::vector<AttrFast> fast;
  mutable std::shared_ptr<const PyChecks> pychecks;
  PyObject* rearm = nullptr;  // PYVALUES: (read result) -> new checks or None; None: never
  mutable int streak = 0;  // PYVALUES: re-arms since its checks last held natively
  mutable int skipped = 0;  // PYVALUES: Python reads made without a re-arm, once stopped
  std::vector<int64_t> ints, codes;  // IDENTITY: the leaf indices and their expected codes
};

struct Env {
  PyObject* env;
  PyObject* spec = nullptr;
  PyObject* leaves = nullptr;
  PyObject* state = nullptr;
  ~Env() {
    Py_XDECREF(spec);
    Py_XDECREF(leaves);
    Py_XDECREF(state);
  }
};

PyObject* s_spec = nullptr;
PyObject* s_leaves = nullptr;
PyObject* s_state = nullptr;

// A failed read: an Exception means the guard fails (as in GuardSet.holds); anything else
// (KeyboardInterrupt) propagates.
inline int failed_read() {
  if (PyErr_ExceptionMatches(PyExc_Exception)) {
    PyErr_Clear();
    return FAILS;
  }
  return ERROR;
}

inline int compare(PyObject* actual, PyObject* expected) {
  if (actual == expected) return HOLDS;
  int eq = PyObject_RichCompareBool(actual, expected, Py_EQ);
  if (eq < 0) return failed_read();
  return eq ? HOLDS : FAILS;
}

bool build_pychecks(PyObject* seq, std::vector<PyCheck>& out);

// The guard's Python read against its expected value; with `held`, a read that holds is handed
// over there (a new reference).
int python_read(const Op& op, PyObject* env, PyObject** held = nullptr) {
  PyObject* r = PyObject_CallOneArg(op.read, env);
  if (r == nullptr) return failed_read();
  int ne = PyObject_RichCompareBool(r, op.expected, Py_NE);
  if (ne == 0 && held != nullptr) {
    *held = r;
    return HOLDS;
  }
  Py_DECREF(r);
  if (ne < 0) return failed_read();
  return ne ? FAILS : HOLDS;
}

// Re-arms in a row, with no call held natively between them, after which an op re-arms only at
// every kRearmRetry-th Python read (until its checks hold again): its values are rebound to
// equal objects at every call, and each re-arm would cost about as much again as the read.
constexpr int kRearmStreak = 4;
constexpr int kRearmRetry = 64;

inline bool should_rearm(const Op& op) {
  if (op.rearm == nullptr) return false;
  return op.streak < kRearmStreak || ++op.skipped % kRearmRetry == 0;
}

// The Python read of a PYVALUES op that has a re-arm callable: where the values are unchanged,
// the checks made by the read's walk (of the objects it read) replace the op's, so that an
// object set again to an equal value fails its identity check once, not at every call. A
// re-arm that raises or returns None keeps the old checks (counted: rearm_errors).
int python_read_rearm(const Op& op, PyObject* env, unsigned long long* rearms,
                      unsigned long long* errors) {
  PyObject* r = nullptr;
  int read = python_read(op, env, &r);
  if (read != HOLDS) return read;
  PyObject* checks = PyObject_CallOneArg(op.rearm, r);
  Py_DECREF(r);
  if (checks == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return ERROR;
    PyErr_Clear();
    *errors += 1;
    return HOLDS;
  }
  if (checks == Py_None) {
    Py_DECREF(checks);
    return HOLDS;  // NOTE: the read's values need a Python read anyway
  }
  auto set = std::make_shared<PyChecks>();
  set->owner = checks;  // NOTE: takes the reference
  if (!build_pychecks(checks, set->checks)) {
    PyErr_Clear();
    *errors += 1;
    return HOLDS;
  }
  op.pychecks = std::move(set);
  op.streak += 1;
  *rearms += 1;
  return HOLDS;
}

PyObject* env_attr(Env& e, PyObject** slot, PyObject* name) {
  if (*slot == nullptr) *slot = PyObject_GetAttr(e.env, name);
  return *slot;
}

// seq[i] as a borrowed reference, nullptr when out of range (no exception set).
inline PyObject* item(PyObject* seq, Py_ssize_t i) {
  if (PyList_CheckExact(seq)) {
    return i < PyList_GET_SIZE(seq) ? PyList_GET_ITEM(seq, i) : nullptr;
  }
  if (PyTuple_CheckExact(seq)) {
    return i < PyTuple_GET_SIZE(seq) ? PyTuple_GET_ITEM(seq, i) : nullptr;
  }
  return nullptr;
}

int run_structure(const Op& op, Env& e) {
  PyObject* spec = env_attr(e, &e.spec, s_spec);
  PyObject* leaves = env_attr(e, &e.leaves, s_leaves);
  if (spec == nullptr || leaves == nullptr) return failed_read();
  int r = compare(spec, op.a);
  if (r != HOLDS) return r;
  if (!PyList_CheckExact(leaves) && !PyTuple_CheckExact(leaves)) return PYTHON;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(leaves);
  if (n != static_cast<Py_ssize_t>(op.xs.size())) return FAILS;
  PyObject** items = PySequence_Fast_ITEMS(leaves);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* leaf = items[i];
    bool want_tensor = op.ys[i] == Py_True;
    bool is_tensor = plain(leaf);
    if (!is_tensor) {
      int k = PyObject_IsInstance(leaf, g_tensor_class);
      if (k < 0) return failed_read();
      is_tensor = k == 1;
    }
    if (want_tensor != is_tensor) return FAILS;
    if (is_tensor) continue;
    // NOTE: type(leaf).__name__, as type_name() in CPython's typeobject.c computes it
    PyTypeObject* tp = Py_TYPE(leaf);
    if (tp->tp_flags & Py_TPFLAGS_HEAPTYPE) {
      PyObject* name = reinterpret_cast<PyHeapTypeObject*>(tp)->ht_name;
      int c = compare(name, op.xs[i]);
      if (c != HOLDS) return c;
    } else {
      const char* s = strrchr(tp->tp_name, '.');
      s = s ? s + 1 : tp->tp_name;
      const char* want = PyUnicode_AsUTF8(op.xs[i]);
      if (want == nullptr) return failed_read();
      if (strcmp(s, want) != 0) return FAILS;
    }
  }
  return HOLDS;
}

// FNV-1a over the mixed words at ptr + offsets, each `size` bytes read little-endian (as
// plait.guards.sampled._digest computes it). NOTE: called once the pointer, dtype, sizes and
// strides are the ones the offsets were taken for, and the storage holds the last byte.
uint64_t sampled_digest(const char* ptr, const TCheck& c) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (int64_t off : c.offsets) {
    uint64_t word = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    // NOTE: fixed-size copies compile to one load each (a variable size calls memcpy)
    switch (c.size) {
      case 4: { uint32_t v; std::memcpy(&v, ptr + off, 4); word = v; break; }
      case 8: std::memcpy(&word, ptr + off, 8); break;
      case 2: { uint16_t v; std::memcpy(&v, ptr + off, 2); word = v; break; }
      default: std::memcpy(&word, ptr + off, static_cast<size_t>(c.size)); break;
    }
#else
    const unsigned char* p = reinterpret_cast<const unsigned char*>(ptr + off);
    for (int64_t i = 0; i < c.size; ++i) word |= static_cast<uint64_t>(p[i]) << (8 * i);
#endif
    word ^= word >> 33;  // NOTE: MurmurHash3's finalizer on each word first
    word *= 0xFF51AFD7ED558CCDULL;
    word ^= word >> 33;
    h = (h ^ word) * 0x100000001B3ULL;
  }
  return h;
}

int check_sample(const TCheck& c, c10::TensorImpl* t) {
  if (t->device().type() != c10::DeviceType::CPU || !t->has_storage()) return FAILS;
  c10::IntArrayRef st = t->strides();
  if (st.size() != c.strides.size()) return FAILS;
  for (size_t d = 0; d < st.size(); ++d) {
    if (st[d] != c.strides[d]) return FAILS;
  }
  int64_t span = static_cast<int64_t>(t->storage().nbytes()) -
                 t->storage_offset() * static_cast<int64_t>(t->dtype().itemsize());
  if (c.end > span) return FAILS;
  const char* ptr = static_cast<const char*>(t->data());
  return sampled_digest(ptr, c) == c.digest ? HOLDS : FAILS;
}

int check_tensor(const TCheck& c, PyObject* obj) {
  if ((c.flags & F_ID) && reinterpret_cast<uintptr_t>(obj) != c.id) return FAILS;
  if (!plain(obj)) return PYTHON;
  c10::TensorImpl* t = impl_of(obj);
  try {
    if ((c.flags & F_VERSION) &&
        static_cast<int64_t>(t->version_counter().current_version()) != c.version) {
      return FAILS;
    }
    if ((c.flags & F_PTR) && reinterpret_cast<uintptr_t>(t->mutable_data()) != c.ptr) {
      return FAILS;
    }
    if (c.flags & F_META) {
      if (t->dtype() != c.dtype || t->device() != c.device) return FAILS;
    }
    if (c.flags & F_SIZES) {
      c10::IntArrayRef s = t->sizes();
      if (s.size() != c.sizes.size()) return FAILS;
      for (size_t d = 0; d < s.size(); ++d) {
        if (!c.wild[d] && s[d] != c.sizes[d]) return FAILS;
      }
    }
    if ((c.flags & F_GRAD) && t->requires_grad() != c.grad) return FAILS;
    if (c.flags & F_SAMPLE) return check_sample(c, t);
  } catch (const std::exception&) {
    return PYTHON;  // NOTE: the guard's own read decides (and explains)
  }
  return HOLDS;
}

inline void prefetch_lines(const void* p, int lines) {
  const char* c = static_cast<const char*>(p);
  for (int i = 0; i < lines; ++i) __builtin_prefetch(c + 64 * i);
}

// NOTE: a call's kernels evict the guard's objects, and a tensor's check follows a chain of
// pointers (the Python object, its TensorImpl, then the impl's version counter, storage and
// autograd metadata): each level is requested for every tensor before the next level is read,
// so that the tensors' cache misses overlap instead of queueing one after another. Prefetches
// never fault and decide nothing: the checks below read everything again.
void prefetch_tensors(const Op& op, const std::vector<PyObject*>& objs) {
  for (size_t i = 0; i < objs.size(); ++i) {
    const TCheck& c = op.checks[i];
    if (c.flags & F_SAMPLE) {
      for (int64_t off : c.offsets) __builtin_prefetch(reinterpret_cast<const char*>(c.ptr) + off);
    }
    if (objs[i] != nullptr) __builtin_prefetch(objs[i]);
  }
  for (PyObject* obj : objs) {
    if (obj != nullptr && plain(obj)) {
      prefetch_lines(impl_of(obj), (sizeof(c10::TensorImpl) + 63) / 64);
    }
  }
  for (size_t i = 0; i < objs.size(); ++i) {
    if (objs[i] == nullptr || !plain(objs[i])) continue;
    const c10::TensorImpl* t = impl_of(objs[i]);
    const int flags = op.checks[i].flags;
    if (flags & F_VERSION) __builtin_prefetch(plait_layout::version_counter_of(t));
    if (flags & (F_PTR | F_SAMPLE)) __builtin_prefetch(t->unsafe_storage().unsafeGetStorageImpl());
    if (flags & F_GRAD) __builtin_prefetch(t->autograd_meta());
  }
}

int run_tensors(const Op& op, Env& e) {
  PyObject* seqs[2] = {nullptr, nullptr};
  std::vector<PyObject*> objs;  // NOTE: each check's object, read once (nullptr: past the end)
  objs.reserve(op.checks.size());
  for (const TCheck& c : op.checks) {
    PyObject*& seq = seqs[c.where];
    if (seq == nullptr) {
      seq = c.where == 0 ? env_attr(e, &e.leaves, s_leaves) : env_attr(e, &e.state, s_state);
      if (seq == nullptr) return failed_read();
      if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) return PYTHON;
    }
    objs.push_back(item(seq, c.index));
  }
  prefetch_tensors(op, objs);
  for (size_t i = 0; i < objs.size(); ++i) {
    if (objs[i] == nullptr) return FAILS;  // NOTE: the read would raise IndexError
    int r = check_tensor(op.checks[i], objs[i]);
    if (r != HOLDS) return r;
  }
  return HOLDS;
}

// NOTE: as prefetch_tensors: every table, then every table's keys, requested before the reads
void prefetch_dicts(const std::vector<PyObject*>& dicts) {
  for (PyObject* d : dicts) __builtin_prefetch(d);
  for (PyObject* d : dicts) {
    if (PyDict_CheckExact(d)) __builtin_prefetch(reinterpret_cast<PyDictObject*>(d)->ma_keys);
  }
}

int run_edges(const Op& op) {
  prefetch_dicts(op.xs);
  for (size_t i = 0; i < op.xs.size(); ++i) {
    PyObject* table = op.xs[i];
    if (!PyDict_Check(table)) return PYTHON;
    PyObject* v = PyDict_GetItemWithError(table, op.ys[i]);
    if (v == nullptr && PyErr_Occurred()) return failed_read();
    if (v != op.zs[i]) return FAILS;
  }
  return HOLDS;
}

inline unsigned int valid_tag(PyTypeObject* tp) {
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
  if (!(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return 0;
#endif
  return tp->tp_version_tag;
}

// Whether getattr(o, name) is o.__dict__[name] for every o of type tp that has it: no class
// attribute of that name, object's __getattribute__ (a __getattr__ only runs on a miss).
AttrFast attr_fast(PyObject* o, PyObject* name) {
  AttrFast f;
  PyTypeObject* tp = Py_TYPE(o);
  if (tp->tp_getattro != PyObject_GenericGetAttr && tp->tp_getattro != g_hook_getattro) return f;
  if (_PyType_Lookup(tp, s_getattribute) != g_object_getattribute) return f;
  if (_PyType_Lookup(tp, name) != nullptr) return f;  // NOTE: also gives tp a version tag
  if (tp->tp_dictoffset == 0) return f;
  f.type = tp;
  f.tag = valid_tag(tp);
  return f;
}

// A new reference to getattr(o, name), nullptr with an exception set on failure.
inline PyObject* get_attr(PyObject* o, PyObject* name, const AttrFast& f) {
  PyTypeObject* tp = Py_TYPE(o);
  if (f.tag != 0 && tp == f.type && valid_tag(tp) == f.tag) {
#if PY_VERSION_HEX < 0x030D0000
    PyObject** slot = _PyObject_GetDictPtr(o);
    PyObject* dict = slot != nullptr ? *slot : nullptr;
    if (dict != nullptr && PyDict_Check(dict)) {
      PyObject* v = PyDict_GetItemWithError(dict, name);
      Py_XINCREF(v);
      if (v != nullptr || PyErr_Occurred()) return v;
    }
#else
    PyObject* dict = PyObject_GenericGetDict(o, nullptr);
    if (dict == nullptr) return nullptr;
    PyObject* v = PyDict_Check(dict) ? PyDict_GetItemWithError(dict, name) : nullptr;
    Py_XINCREF(v);
    Py_DECREF(dict);
    if (v != nullptr || PyErr_Occurred()) return v;
#endif
  }
  return PyObject_GetAttr(o, name);
}

int run_attrs(const Op& op) {
  // NOTE: each object's header and the words before it (where CPython 3.11+ keeps a managed
  // instance dict's pointer), requested for all objects before the reads
  for (PyObject* o : op.xs) {
    __builtin_prefetch(o);
    __builtin_prefetch(reinterpret_cast<const char*>(o) - 32);
  }
  for (size_t i = 0; i < op.xs.size(); ++i) {
    PyObject* v = get_attr(op.xs[i], op.a, op.fast[i]);
    if (v == nullptr) return failed_read();
    int r = compare(v, op.ys[i]);
    Py_DECREF(v);
    if (r != HOLDS) return r;
  }
  return HOLDS;
}

int run_call0(const Op& op) {
  PyObject* r = PyObject_CallNoArgs(op.a);
  if (r == nullptr) {
    if (op.exact) return failed_read();
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return ERROR;
    PyErr_Clear();
    return PYTHON;
  }
  int c = compare(r, op.expected);
  Py_DECREF(r);
  if (c == FAILS && !op.exact) return PYTHON;
  return c;
}

int run_calls0(const Op& op) {
  for (size_t i = 0; i < op.xs.size(); ++i) {
    PyObject* r = PyObject_CallNoArgs(op.xs[i]);
    if (r == nullptr) {
      if (op.exact) return failed_read();
      if (!PyErr_ExceptionMatches(PyExc_Exception)) return ERROR;
      PyErr_Clear();
      return PYTHON;
    }
    int c = compare(r, op.ys[i]);
    Py_DECREF(r);
    if (c == FAILS && !op.exact) return PYTHON;
    if (c != HOLDS) return c;
  }
  return HOLDS;
}

int run_leaf(const Op& op, Env& e) {
  PyObject* leaves = env_attr(e, &e.leaves, s_leaves);
  if (leaves == nullptr) return failed_read();
  if (!PyList_CheckExact(leaves) && !PyTuple_CheckExact(leaves)) return PYTHON;
  PyObject* leaf = item(leaves, op.index);
  if (leaf == nullptr) return FAILS;
  if (op.code == LEAF_IS) return leaf == op.a ? HOLDS : FAILS;
  int r = compare(reinterpret_cast<PyObject*>(Py_TYPE(leaf)), op.a);
  if (r != HOLDS) return r;
  if (op.code == LEAF_BITS) {
    // NOTE: a float by its IEEE-754 bits: -0.0 is not 0.0, a NaN is the same NaN
    if (!PyFloat_Check(leaf)) return PYTHON;
    double d = PyFloat_AS_DOUBLE(leaf);
    int64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    return bits == op.bits ? HOLDS : FAILS;
  }
  return compare(leaf, op.xs[0]);
}

// The version of a dict: changes with every change of its items (CPython's PEP 509 tag while
// it exists; 0 where it does not: no fast path).
// NOTE: deprecated from 3.12 (a compile warning, an error under -Werror), still bumped by every
// change of the items through 3.13 (its low bits tag the dict's watchers), removed in 3.14.
inline uint64_t dict_version(PyObject* d) {
#if PY_VERSION_HEX < 0x030E0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(d)->ma_version_tag;
#pragma GCC diagnostic pop
#else
  (void)d;
  return 0;
#endif
}

inline bool fast_dict(PyObject* d) {
  return PyDict_CheckExact(d) || PyODict_CheckExact(d);
}

// mapping.get(key, absent) as a borrowed-or-owned pair: *owned is set when the caller must
// decref. nullptr with an exception set on an error other than a missing key.
PyObject* lookup(PyObject* mapping, PyObject* key, PyObject* absent, bool* owned) {
  *owned = false;
  if (PyDict_Check(mapping) && fast_dict(mapping)) {
    PyObject* v = PyDict_GetItemWithError(mapping, key);
    if (v == nullptr && !PyErr_Occurred()) return absent;
    return v;
  }
  PyObject* v = PyObject_GetItem(mapping, key);
  if (v == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_KeyError)) return nullptr;
    PyErr_Clear();
    return absent;
  }
  *owned = true;
  return v;
}

int run_pycheck(const PyCheck& c, PyObject* absent) {
  switch (c.kind) {
    case PK_ITEMS: {
      bool versioned = fast_dict(c.a);
      if (versioned && c.valid && dict_version(c.a) == c.seen) return HOLDS;
      for (size_t i = 0; i < c.keys.size(); ++i) {
        bool owned = false;
        PyObject* v = lookup(c.a, c.keys[i], absent, &owned);
        if (v == nullptr) return failed_read();
        bool same = v == c.values[i];
        if (owned) Py_DECREF(v);
        if (!same) return PYTHON;
      }
      if (versioned) {
        c.seen = dict_version(c.a);
        c.valid = c.seen != 0;
      }
      return HOLDS;
    }
    case PK_CELL: {
      PyObject* v = PyCell_GET(c.a);
      return (v == nullptr ? absent : v) == c.b ? HOLDS : PYTHON;
    }
    case PK_FUNC: {
      PyObject* defaults = PyFunction_GET_DEFAULTS(c.a);
      PyObject* kwdefaults = PyFunction_GET_KW_DEFAULTS(c.a);
      if (PyFunction_GET_CODE(c.a) != c.b) return PYTHON;
      if ((defaults == nullptr ? Py_None : defaults) != c.c) return PYTHON;
      if ((kwdefaults == nullptr ? Py_None : kwdefaults) != c.d) return PYTHON;
      return HOLDS;
    }
    case PK_TYPE:
      return reinterpret_cast<PyObject*>(Py_TYPE(c.a)) == c.b ? HOLDS : PYTHON;
    case PK_DICT: {
      if (!fast_dict(c.a)) return PYTHON;
      if (c.valid && dict_version(c.a) == c.seen) return HOLDS;
      if (PyDict_GET_SIZE(c.a) != static_cast<Py_ssize_t>(c.keys.size())) return PYTHON;
      Py_ssize_t pos = 0;
      PyObject *k = nullptr, *v = nullptr;
      size_t i = 0;
      while (PyDict_Next(c.a, &pos, &k, &v)) {
        if (i >= c.keys.size() || k != c.keys[i] || v != c.values[i]) return PYTHON;
        ++i;
      }
      c.seen = dict_version(c.a);
      c.valid = c.seen != 0;
      return HOLDS;
    }
    case PK_LIST: {
      if (!PyList_CheckExact(c.a)) return PYTHON;
      if (PyList_GET_SIZE(c.a) != static_cast<Py_ssize_t>(c.values.size())) return PYTHON;
      for (size_t i = 0; i < c.values.size(); ++i) {
        if (PyList_GET_ITEM(c.a, i) != c.values[i]) return PYTHON;
      }
      return HOLDS;
    }
    case PK_TYPEATTRS: {
      PyTypeObject* tp = reinterpret_cast<PyTypeObject*>(c.a);
      unsigned int tag = valid_tag(tp);
      if (c.valid && tag != 0 && tag == c.seen) return HOLDS;
      for (size_t i = 0; i < c.keys.size(); ++i) {
        PyObject* v = _PyType_Lookup(tp, c.keys[i]);
        if ((v == nullptr ? absent : v) != c.values[i]) return PYTHON;
      }
      c.seen = valid_tag(tp);  // NOTE: _PyType_Lookup assigns a tag when there was none
      c.valid = c.seen != 0;
      return HOLDS;
    }
    case PK_SET: {  // NOTE: an exact set holding exactly these items (classes, strings)
      if (!PySet_CheckExact(c.a)) return PYTHON;
      if (PySet_GET_SIZE(c.a) != static_cast<Py_ssize_t>(c.values.size())) return PYTHON;
      for (PyObject* x : c.values) {
        int in = PySet_Contains(c.a, x);
        if (in < 0) return failed_read();
        if (in == 0) return PYTHON;
      }
      return HOLDS;
    }
    case PK_CALL: {  // NOTE: fn() is value; any other answer (or an error): the read decides
      PyObject* v = PyObject_CallNoArgs(c.a);
      if (v == nullptr) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return ERROR;
        PyErr_Clear();
        return PYTHON;
      }
      bool same = v == c.b;
      Py_DECREF(v);
      return same ? HOLDS : PYTHON;
    }
  }
  return PYTHON;
}

// IDENTITY: each leaf of op.ints reads as the index of the first of them it is, as -1 - k for
// the state entry k it is (op.exact: the state is scanned), or as kHeld - c for the held
// tensor c (op.xs); the codes must be op.codes (plait.frontend.identity_guard).
constexpr int64_t kHeld = -(int64_t(1) << 40);

int run_identity(const Op& op, Env& e) {
  PyObject* leaves = env_attr(e, &e.leaves, s_leaves);
  if (leaves == nullptr) return failed_read();
  if (!PyList_CheckExact(leaves) && !PyTuple_CheckExact(leaves)) return PYTHON;
  PyObject* state = nullptr;
  Py_ssize_t ns = 0;
  if (op.exact) {
    state = env_attr(e, &e.state, s_state);
    if (state == nullptr) return failed_read();
    if (!PyList_CheckExact(state) && !PyTuple_CheckExact(state)) return PYTHON;
    ns = PySequence_Fast_GET_SIZE(state);
  }
  for (size_t p = 0; p < op.ints.size(); ++p) {
    PyObject* leaf = item(leaves, op.ints[p]);
    if (leaf == nullptr) return FAILS;
    int64_t code = op.ints[p];
    bool found = false;
    for (Py_ssize_t k = 0; k < ns && !found; ++k) {
      if (PySequence_Fast_GET_ITEM(state, k) == leaf) code = -1 - k, found = true;
    }
    for (size_t c = 0; c < op.xs.size() && !found; ++c) {
      if (op.xs[c] == leaf) code = kHeld - int64_t(c), found = true;
    }
    for (size_t q = 0; q < p && !found; ++q) {
      if (item(leaves, op.ints[q]) == leaf) code = op.ints[q], found = true;
    }
    if (code != op.codes[p]) return FAILS;
  }
  return HOLDS;
}

int run_pyvalues(const Op& op) {
  std::shared_ptr<const PyChecks> keep = op.pychecks;  // NOTE: a re-arm may replace it
  for (const PyCheck& c : keep->checks) __builtin_prefetch(c.a);  // NOTE: as prefetch_dicts
  for (const PyCheck& c : keep->checks) {
    int r = run_pycheck(c, op.a);
    if (r != HOLDS) return r;
  }
  op.streak = 0;
  return HOLDS;
}

int run(const Op& op, Env& e) {
  switch (op.code) {
    case CALL: return PYTHON;
    case CALL0: return run_call0(op);
    case CALLS0: return run_calls0(op);
    case STRUCTURE: return run_structure(op, e);
    case TENSORS: return run_tensors(op, e);
    case EDGES: return run_edges(op);
    case ATTRS: return run_attrs(op);
    case LEAF_VALUE:
    case LEAF_BITS:
    case LEAF_IS: return run_leaf(op, e);
    case PYVALUES: return run_pyvalues(op);
    case IDENTITY: return run_identity(op, e);
  }
  return PYTHON;
}

// ---------------------------------------------------------------------------------------------
// Building ops from their Python tuples

bool objects(PyObject* seq, std::vector<PyObject*>& out) {
  if (!PyTuple_Check(seq)) {
    PyErr_SetString(PyExc_TypeError, "expected a tuple");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); ++i) out.push_back(PyTuple_GET_ITEM(seq, i));
  return true;
}

bool int64_items(PyObject* seq, std::vector<int64_t>& out) {
  if (!PyTuple_Check(seq)) {
    PyErr_SetString(PyExc_TypeError, "expected a tuple of ints");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); ++i) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) return false;
    out.push_back(v);
  }
  return true;
}

// (where, index, flags, id, version, ptr, prototype or None, sizes or None, requires_grad,
//  (strides, offsets, size, digest) or None)
bool tensor_check(PyObject* spec, TCheck& c) {
  int where = 0, grad = 0;
  long long version = 0;
  unsigned long long id = 0, ptr = 0;
  PyObject *proto = nullptr, *sizes = nullptr, *sample = nullptr;
  if (!PyArg_ParseTuple(spec, "iniKLKOOpO", &where, &c.index, &c.flags, &id, &version, &ptr,
                        &proto, &sizes, &grad, &sample)) {
    return false;
  }
  if (c.flags & F_SAMPLE) {
    PyObject *strides = nullptr, *offsets = nullptr;
    long long size = 0;
    unsigned long long digest = 0;
    if (!PyArg_ParseTuple(sample, "OOLK", &strides, &offsets, &size, &digest)) return false;
    if (!int64_items(strides, c.strides) || !int64_items(offsets, c.offsets)) return false;
    if (size < 1 || size > 8 || !(c.flags & F_PTR) || !(c.flags & F_META) ||
        !(c.flags & F_SIZES)) {
      PyErr_SetString(PyExc_ValueError, "a sample needs 1 to 8 bytes, the pointer and the type");
      return false;
    }
    c.size = size;
    c.digest = digest;
    for (int64_t off : c.offsets) {
      if (off < 0) {
        PyErr_SetString(PyExc_ValueError, "a sampled offset is negative");
        return false;
      }
      c.end = off + size > c.end ? off + size : c.end;
    }
    if (c.offsets.empty()) {
      PyErr_SetString(PyExc_ValueError, "a sample reads no element");
      return false;
    }
  }
  c.where = where ? 1 : 0;
  c.id = static_cast<uintptr_t>(id);
  c.version = version;
  c.ptr = static_cast<uintptr_t>(ptr);
  c.grad = grad != 0;
  if (c.flags & F_META) {
    if (!plain(proto)) {
      PyErr_SetString(PyExc_TypeError, "prototype must be a plain tensor");
      return false;
    }
    c10::TensorImpl* t = impl_of(proto);
    c.dtype = t->dtype();
    c.device = t->device();
  }
  if (c.flags & F_SIZES) {
    if (!PyTuple_Check(sizes)) {
      PyErr_SetString(PyExc_TypeError, "sizes must be a tuple");
      return false;
    }
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(sizes); ++d) {
      PyObject* n = PyTuple_GET_ITEM(sizes, d);
      if (n == Py_None) {
        c.sizes.push_back(0);
        c.wild.push_back(1);
      } else {
        long long v = PyLong_AsLongLong(n);
        if (v == -1 && PyErr_Occurred()) return false;
        c.sizes.push_back(v);
        c.wild.push_back(0);
      }
    }
  }
  return true;
}

// The checks of a PYVALUES op from their tuple (plait.guards.guard.ReadPyValues.checks); the
// objects they point to are borrowed from `seq`.
bool build_pychecks(PyObject* seq, std::vector<PyCheck>& out) {
  std::vector<PyObject*> checks;
  if (!objects(seq, checks)) return false;
  for (PyObject* t : checks) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1) {
      PyErr_SetString(PyExc_TypeError, "a Python-value check is a tuple (kind, ...)");
      return false;
    }
    PyCheck c;
    c.kind = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(t, 0)));
    if (c.kind == -1 && PyErr_Occurred()) return false;
    Py_ssize_t m = PyTuple_GET_SIZE(t);
    auto at = [&](Py_ssize_t i) { return i < m ? PyTuple_GET_ITEM(t, i) : Py_None; };
    bool ok = true;
    switch (c.kind) {
      case PK_ITEMS:
      case PK_DICT:
      case PK_TYPEATTRS:
        c.a = at(1);
        ok = objects(at(2), c.keys) && objects(at(3), c.values) &&
             c.keys.size() == c.values.size();
        if (ok && c.kind == PK_TYPEATTRS && !PyType_Check(c.a)) c.kind = PK_PYTHON;
        if (ok && c.kind == PK_DICT && !PyDict_Check(c.a)) c.kind = PK_PYTHON;
        break;
      case PK_CELL:
        c.a = at(1);
        c.b = at(2);
        if (!PyCell_Check(c.a)) c.kind = PK_PYTHON;
        break;
      case PK_FUNC:
        c.a = at(1);
        c.b = at(2);
        c.c = at(3);
        c.d = at(4);
        if (!PyFunction_Check(c.a)) c.kind = PK_PYTHON;
        break;
      case PK_TYPE:
        c.a = at(1);
        c.b = at(2);
        break;
      case PK_CALL:
        c.a = at(1);
        c.b = at(2);
        if (!PyCallable_Check(c.a)) c.kind = PK_PYTHON;
        break;
      case PK_LIST:
      case PK_SET:
        c.a = at(1);
        ok = objects(at(2), c.values);
        break;
      default:
        c.kind = PK_PYTHON;
    }
    if (!ok) return false;
    out.push_back(std::move(c));
  }
  return true;
}

bool build_op(PyObject* t, Op& op) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 3) {
    PyErr_SetString(PyExc_TypeError, "an op is a tuple (code, read, expected, ...)");
    return false;
  }
  op.tuple = t;
  op.code = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(t, 0)));
  if (op.code == -1 && PyErr_Occurred()) return false;
  op.read = PyTuple_GET_ITEM(t, 1);
  op.expected = PyTuple_GET_ITEM(t, 2);
  Py_ssize_t n = PyTuple_GET_SIZE(t);
  auto arg = [&](Py_ssize_t i) { return i < n ? PyTuple_GET_ITEM(t, i) : Py_None; };
  switch (op.code) {
    case CALL: return true;
    case CALL0:
      op.a = arg(3);
      op.exact = PyObject_IsTrue(arg(4)) == 1;
      return true;
    case CALLS0:
      op.exact = PyObject_IsTrue(arg(5)) == 1;
      return objects(arg(3), op.xs) && objects(arg(4), op.ys) && op.xs.size() == op.ys.size();
    case STRUCTURE:
      op.a = arg(3);
      return objects(arg(4), op.xs) && objects(arg(5), op.ys) && op.xs.size() == op.ys.size();
    case TENSORS: {
      std::vector<PyObject*> specs;
      if (!objects(arg(3), specs)) return false;
      for (PyObject* s : specs) {
        TCheck c;
        if (!tensor_check(s, c)) return false;
        op.checks.push_back(std::move(c));
      }
      return true;
    }
    case EDGES: return objects(arg(3), op.xs) && objects(arg(4), op.ys) && objects(arg(5), op.zs);
    case ATTRS:
      op.a = arg(4);
      if (!PyUnicode_Check(op.a)) {
        PyErr_SetString(PyExc_TypeError, "an attribute name must be a str");
        return false;
      }
      if (!objects(arg(3), op.xs) || !objects(op.expected, op.ys)) return false;
      if (op.xs.size() != op.ys.size()) {
        PyErr_SetString(PyExc_ValueError, "as many expected values as objects");
        return false;
      }
      for (PyObject* o : op.xs) op.fast.push_back(attr_fast(o, op.a));
      return true;
    case LEAF_VALUE:
    case LEAF_IS:
      op.index = PyLong_AsSsize_t(arg(3));
      if (op.index == -1 && PyErr_Occurred()) return false;
      op.a = arg(4);
      op.xs.push_back(arg(5));
      return true;
    case IDENTITY:  // (leaves, codes, scan the state, held tensors)
      op.exact = PyObject_IsTrue(arg(5)) == 1;
      if (!int64_items(arg(3), op.ints) || !int64_items(arg(4), op.codes)) return false;
      if (op.ints.size() != op.codes.size()) {
        PyErr_SetString(PyExc_ValueError, "as many codes as leaves");
        return false;
      }
      return objects(arg(6), op.xs);
    case PYVALUES: {  // (checks, absent, re-arm callable or None)
      auto set = std::make_shared<PyChecks>();
      if (!build_pychecks(arg(3), set->checks)) return false;
      op.pychecks = std::move(set);
      op.a = arg(4);
      if (arg(5) != Py_None) op.rearm = arg(5);
      return true;
    }
    case LEAF_BITS:  // (index, type, bits as a signed 64-bit int)
      op.index = PyLong_AsSsize_t(arg(3));
      if (op.index == -1 && PyErr_Occurred()) return false;
      op.a = arg(4);
      op.bits = PyLong_AsLongLong(arg(5));
      if (op.bits == -1 && PyErr_Occurred()) return false;
      return true;
  }
  PyErr_Format(PyExc_ValueError, "unknown op code %d", op.code);
  return false;
}

// ---------------------------------------------------------------------------------------------
// Evaluator

struct Evaluator {
  PyObject_HEAD
  std::vector<Op>* ops;
  PyObject* tuples;  // the op tuples (owns the objects the ops point to)
  unsigned long long python_reads;
  unsigned long long rearms;
  unsigned long long rearm_errors;
  vectorcallfunc vectorcall;
};

// NOTE: the ops hold modules and closures; GC support lets a cycle through them be collected.
int evaluator_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* ev = reinterpret_cast<Evaluator*>(self);
  Py_VISIT(ev->tuples);
  if (ev->ops != nullptr) {
    for (const Op& op : *ev->ops) {
      if (op.pychecks) Py_VISIT(op.pychecks->owner);  // NOTE: a re-armed op's checks
    }
  }
  return 0;
}

int evaluator_clear(PyObject* self) {
  auto* ev = reinterpret_cast<Evaluator*>(self);
  if (ev->ops != nullptr) ev->ops->clear();  // NOTE: they borrow from the tuples
  Py_CLEAR(ev->tuples);
  return 0;
}

void evaluator_dealloc(PyObject* self) {
  auto* ev = reinterpret_cast<Evaluator*>(self);
  PyObject_GC_UnTrack(self);
  evaluator_clear(self);
  delete ev->ops;
  ev->ops = nullptr;
  Py_TYPE(self)->tp_free(self);
}

PyObject* evaluator_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                               PyObject* kwnames) {
  auto* ev = reinterpret_cast<Evaluator*>(self);
  if (kwnames != nullptr || PyVectorcall_NARGS(nargsf) != 1) {
    PyErr_SetString(PyExc_TypeError, "Evaluator(env) takes one argument");
    return nullptr;
  }
  if (ev->tuples == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "a cleared Evaluator");
    return nullptr;
  }
  Env e{args[0]};
  for (const Op& op : *ev->ops) {
    int r = run(op, e);
    if (r == PYTHON) {
      ev->python_reads += 1;
      r = should_rearm(op) ? python_read_rearm(op, e.env, &ev->rearms, &ev->rearm_errors)
                           : python_read(op, e.env);
    }
    if (r == ERROR) return nullptr;
    if (r != HOLDS) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

PyObject* evaluator_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* ops = nullptr;
  static const char* kw[] = {"ops", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!", const_cast<char**>(kw), &PyTuple_Type,
                                   &ops)) {
    return nullptr;
  }
  if (!g_configured) {
    PyErr_SetString(PyExc_RuntimeError, "_plait_guards.configure() was not called");
    return nullptr;
  }
  // NOTE: tp_alloc of a GC type returns it tracked; traverse and clear accept a partial one
  auto* ev = reinterpret_cast<Evaluator*>(type->tp_alloc(type, 0));
  if (ev == nullptr) return nullptr;
  ev->ops = new std::vector<Op>();
  ev->python_reads = 0;
  ev->rearms = 0;
  ev->rearm_errors = 0;
  ev->vectorcall = evaluator_vectorcall;
  Py_INCREF(ops);
  ev->tuples = ops;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ops); ++i) {
    Op op;
    if (!build_op(PyTuple_GET_ITEM(ops, i), op)) {
      Py_DECREF(ev);
      return nullptr;
    }
    ev->ops->push_back(std::move(op));
  }
  return reinterpret_cast<PyObject*>(ev);
}

PyObject* evaluator_python_reads(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<Evaluator*>(self)->python_reads);
}

PyObject* evaluator_rearms(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<Evaluator*>(self)->rearms);
}

PyObject* evaluator_rearm_errors(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<Evaluator*>(self)->rearm_errors);
}

PyObject* evaluator_len(PyObject* self, void*) {
  return PyLong_FromSize_t(reinterpret_cast<Evaluator*>(self)->ops->size());
}

PyGetSetDef evaluator_getset[] = {
    {"python_reads", evaluator_python_reads, nullptr,
     "ops decided by the guard's Python read since creation", nullptr},
    {"rearms", evaluator_rearms, nullptr,
     "Python-value checks replaced after a read found the values unchanged", nullptr},
    {"rearm_errors", evaluator_rearm_errors, nullptr,
     "re-arms that failed (the old checks were kept)", nullptr},
    {"size", evaluator_len, nullptr, "the number of ops", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject EvaluatorType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------------------------------------
// Fetcher

struct Fetcher {
  PyObject_HEAD
  PyObject* tables;
  PyObject* keys;
};

int fetcher_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<Fetcher*>(self)->tables);
  Py_VISIT(reinterpret_cast<Fetcher*>(self)->keys);
  return 0;
}

int fetcher_clear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<Fetcher*>(self)->tables);
  Py_CLEAR(reinterpret_cast<Fetcher*>(self)->keys);
  return 0;
}

void fetcher_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  fetcher_clear(self);
  Py_TYPE(self)->tp_free(self);
}

PyObject* fetcher_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *tables = nullptr, *keys = nullptr;
  static const char* kw[] = {"tables", "keys", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!", const_cast<char**>(kw), &PyTuple_Type,
                                   &tables, &PyTuple_Type, &keys)) {
    return nullptr;
  }
  if (PyTuple_GET_SIZE(tables) != PyTuple_GET_SIZE(keys)) {
    PyErr_SetString(PyExc_ValueError, "tables and keys differ in length");
    return nullptr;
  }
  auto* f = reinterpret_cast<Fetcher*>(type->tp_alloc(type, 0));
  if (f == nullptr) return nullptr;
  Py_INCREF(tables);
  Py_INCREF(keys);
  f->tables = tables;
  f->keys = keys;
  return reinterpret_cast<PyObject*>(f);
}

PyObject* fetcher_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* f = reinterpret_cast<Fetcher*>(self);
  if (kwargs != nullptr || PyTuple_GET_SIZE(args) != 0) {
    PyErr_SetString(PyExc_TypeError, "Fetcher() takes no argument");
    return nullptr;
  }
  if (f->tables == nullptr || f->keys == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "a cleared Fetcher");
    return nullptr;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(f->tables);
  PyObject* out = PyList_New(n);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* table = PyTuple_GET_ITEM(f->tables, i);
    PyObject* key = PyTuple_GET_ITEM(f->keys, i);
    PyObject* v;
    if (PyDict_CheckExact(table)) {
      v = PyDict_GetItemWithError(table, key);
      if (v == nullptr) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        Py_DECREF(out);
        return nullptr;
      }
      Py_INCREF(v);
    } else {
      v = PyObject_GetItem(table, key);
      if (v == nullptr) {
        Py_DECREF(out);
        return nullptr;
      }
    }
    PyList_SET_ITEM(out, i, v);
  }
  return out;
}

PyTypeObject FetcherType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------------------------------------
// Module

// configure(plain_types, tensor_class, sample, sample_cdata, hooked_class): the types read
// natively, a check that this build reads a tensor's TensorImpl where PyTorch keeps it, and a
// Python class with __getattr__ (nn.Module).
PyObject* configure(PyObject*, PyObject* args) {
  PyObject *types = nullptr, *tensor_class = nullptr, *sample = nullptr, *hooked = nullptr;
  unsigned long long cdata = 0;
  if (!PyArg_ParseTuple(args, "O!OOKO!", &PyTuple_Type, &types, &tensor_class, &sample, &cdata,
                        &PyType_Type, &hooked)) {
    return nullptr;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(types);
  if (n < 1 || n > 4) {
    PyErr_SetString(PyExc_ValueError, "one to four plain types");
    return nullptr;
  }
  if (Py_TYPE(sample) != reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(types, 0))) {
    PyErr_SetString(PyExc_TypeError, "the sample must be of the first plain type");
    return nullptr;
  }
  if (reinterpret_cast<uintptr_t>(impl_of(sample)) != static_cast<uintptr_t>(cdata)) {
    PyErr_SetString(PyExc_RuntimeError,
                    "this build does not find the TensorImpl where this PyTorch keeps it");
    return nullptr;
  }
  for (int i = 0; i < g_nplain; ++i) Py_CLEAR(g_plain[i]);
  Py_CLEAR(g_tensor_class);
  for (Py_ssize_t i = 0; i < n; ++i) {
    g_plain[i] = PyTuple_GET_ITEM(types, i);
    Py_INCREF(g_plain[i]);
  }
  g_nplain = static_cast<int>(n);
  Py_INCREF(tensor_class);
  g_tensor_class = tensor_class;
  // NOTE: a class with __getattr__ (nn.Module): its tp_getattro is CPython's slot hook, which
  // reads like object.__getattribute__ and calls __getattr__ only on a miss.
  g_hook_getattro = reinterpret_cast<PyTypeObject*>(hooked)->tp_getattro;
  g_object_getattribute = _PyType_Lookup(&PyBaseObject_Type, s_getattribute);
  g_configured = true;
  Py_RETURN_NONE;
}

// tensor_state(t): (version, data pointer) as this build reads them (tests compare them with
// Python's reads).
PyObject* tensor_state(PyObject*, PyObject* obj) {
  if (!g_configured || !plain(obj)) {
    PyErr_SetString(PyExc_TypeError, "a plain tensor, after configure()");
    return nullptr;
  }
  c10::TensorImpl* t = impl_of(obj);
  try {
    return Py_BuildValue("(LK)", static_cast<long long>(t->version_counter().current_version()),
                         static_cast<unsigned long long>(
                             reinterpret_cast<uintptr_t>(t->mutable_data())));
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
}

PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "configure(types, tensor_class, sample, cdata, cls)"},
    {"tensor_state", tensor_state, METH_O, "tensor_state(t) -> (version, data_ptr)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_plait_guards", "plait's guard evaluator", -1,
                         methods};

}  // namespace

PyMODINIT_FUNC PyInit__plait_guards(void) {
  s_spec = PyUnicode_InternFromString("spec");
  s_leaves = PyUnicode_InternFromString("leaves");
  s_state = PyUnicode_InternFromString("state");
  s_getattribute = PyUnicode_InternFromString("__getattribute__");
  if (s_spec == nullptr || s_leaves == nullptr || s_state == nullptr ||
      s_getattribute == nullptr) {
    return nullptr;
  }

  EvaluatorType.tp_name = "_plait_guards.Evaluator";
  EvaluatorType.tp_basicsize = sizeof(Evaluator);
  EvaluatorType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  EvaluatorType.tp_traverse = evaluator_traverse;
  EvaluatorType.tp_clear = evaluator_clear;
  EvaluatorType.tp_doc = "Evaluator(ops)(env) -> bool";
  EvaluatorType.tp_new = evaluator_new;
  EvaluatorType.tp_dealloc = evaluator_dealloc;
  EvaluatorType.tp_call = PyVectorcall_Call;
  EvaluatorType.tp_vectorcall_offset = offsetof(Evaluator, vectorcall);
  EvaluatorType.tp_getset = evaluator_getset;
  if (PyType_Ready(&EvaluatorType) < 0) return nullptr;

  FetcherType.tp_name = "_plait_guards.Fetcher";
  FetcherType.tp_basicsize = sizeof(Fetcher);
  FetcherType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  FetcherType.tp_traverse = fetcher_traverse;
  FetcherType.tp_clear = fetcher_clear;
  FetcherType.tp_doc = "Fetcher(tables, keys)() -> list";
  FetcherType.tp_new = fetcher_new;
  FetcherType.tp_dealloc = fetcher_dealloc;
  FetcherType.tp_call = fetcher_call;
  if (PyType_Ready(&FetcherType) < 0) return nullptr;

  PyObject* m = PyModule_Create(&moduledef);
  if (m == nullptr) return nullptr;
  Py_INCREF(&EvaluatorType);
  Py_INCREF(&FetcherType);
  if (PyModule_AddObject(m, "Evaluator", reinterpret_cast<PyObject*>(&EvaluatorType)) < 0 ||
      PyModule_AddObject(m, "Fetcher", reinterpret_cast<PyObject*>(&FetcherType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

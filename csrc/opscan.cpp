// Reading stored op records for alignment without decoding them into Python objects.
//
// `opguard diff` reads every op of both traces but needs only a few fields of each: its index
// and step, its alignment key (op-name id, phase, call-site id, dtype and shape of every input)
// and the content of its outputs (dtype, shape, fingerprint; view and uninitialized flags).
// Decoding a whole record with msgpack-python costs microseconds (tensor heads, stats, strides,
// producers, arguments: dozens of Python objects per op); OpScanner walks the record's msgpack
// bytes instead and returns just those fields, a chunk of records at a time, as columns.
//
// Exactness. The scanner takes a record only when it knows what the Python reader makes of it;
// anything else (a field of an unexpected type, a duplicated field, an extension type, bytes
// msgpack-python would refuse, deep nesting) comes back as a fallback position and the Python
// reader decodes that record as before. The whole record is validated as msgpack-python would
// decode it (lengths, UTF-8 of every string, hashable map keys, no trailing bytes), so a record
// it would refuse is never taken here.
//
// Alignment keys are interned per scanner (one per trace) to dense ids; the caller defines, once
// per id, the keys at each alignment level (they need the trace's names and call sites), then
// reads them back for the whole chunk. The content of the outputs is returned as the bytes
// msgpack.packb(contents, use_bin_type=True) gives for the list of entries [dtype, shape, hash],
// ["view", dtype, shape] or ["uninitialized", dtype, shape]: Python builds the same bytes for a
// record it decodes itself, so equal contents compare equal whichever side read them.
#include "opscan.h"

#include <Python.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace opguard {
namespace {

// Mirrors opguard/store/schema.py.
constexpr int64_t kFlagView = 1;
constexpr int64_t kFlagUninitialized = 2;
constexpr int kMaxDepth = 64;  // deeper records are left to msgpack-python
// Non-finite values in a tensor entry's stats ("m": [min, max, mean, absmax, nan, inf]).
constexpr int kHasNan = 1;
constexpr int kHasInf = 2;

// What Python's strict UTF-8 decoder accepts: no overlong forms, no surrogates, <= U+10FFFF.
bool valid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, s + i, 8);
      if ((word & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c == 0xE0) {
      len = 3;
      lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      len = 3;
    } else if (c == 0xED) {
      len = 3;
      hi = 0x9F;
    } else if (c == 0xF0) {
      len = 4;
      lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
      len = 4;
    } else if (c == 0xF4) {
      len = 4;
      hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

uint64_t big_endian(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// An integer as msgpack holds it: negative values as int64, the others as uint64.
struct Int {
  bool negative = false;
  uint64_t u = 0;
  int64_t s = 0;
  bool fits_int64() const { return negative || u <= static_cast<uint64_t>(INT64_MAX); }
  int64_t as_int64() const { return negative ? s : static_cast<int64_t>(u); }
};

// A forward-only msgpack reader. Every method returns false when the next object is not of the
// kind asked for or is malformed; the caller then gives the record up.
class Msg {
 public:
  Msg(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  bool done() const { return p_ == end_; }
  const uint8_t* pos() const { return p_; }

  bool nil() {
    if (p_ < end_ && *p_ == 0xc0) {
      ++p_;
      return true;
    }
    return false;
  }

  bool integer(Int& v) {
    if (p_ >= end_) return false;
    const uint8_t b = *p_;
    if (b <= 0x7f) {
      v = Int{false, b, 0};
      ++p_;
      return true;
    }
    if (b >= 0xe0) {
      v = Int{true, 0, static_cast<int8_t>(b)};
      ++p_;
      return true;
    }
    if (b >= 0xcc && b <= 0xcf) {
      const int n = 1 << (b - 0xcc);
      if (!avail(1 + n)) return false;
      v = Int{false, big_endian(p_ + 1, n), 0};
      p_ += 1 + n;
      return true;
    }
    if (b >= 0xd0 && b <= 0xd3) {
      const int n = 1 << (b - 0xd0);
      if (!avail(1 + n)) return false;
      const uint64_t raw = big_endian(p_ + 1, n);
      int64_t value;
      switch (n) {
        case 1:
          value = static_cast<int8_t>(raw);
          break;
        case 2:
          value = static_cast<int16_t>(raw);
          break;
        case 4:
          value = static_cast<int32_t>(raw);
          break;
        default:
          value = static_cast<int64_t>(raw);
          break;
      }
      v = value < 0 ? Int{true, 0, value} : Int{false, static_cast<uint64_t>(value), 0};
      p_ += 1 + n;
      return true;
    }
    return false;
  }

  bool int64(int64_t& out) {
    Int v;
    if (!integer(v) || !v.fits_int64()) return false;
    out = v.as_int64();
    return true;
  }

  bool str(const char*& s, uint32_t& n) {
    if (p_ >= end_) return false;
    const uint8_t b = *p_;
    size_t head;
    if ((b & 0xe0) == 0xa0) {
      head = 1;
      n = b & 0x1f;
    } else if (b >= 0xd9 && b <= 0xdb) {
      const int width = 1 << (b - 0xd9);
      if (!avail(1 + width)) return false;
      head = 1 + width;
      n = static_cast<uint32_t>(big_endian(p_ + 1, width));
    } else {
      return false;
    }
    if (!avail(head + n) || !valid_utf8(p_ + head, n)) return false;
    s = reinterpret_cast<const char*>(p_ + head);
    p_ += head + n;
    return true;
  }

  bool array(uint32_t& n) { return header(n, 0x90, 0xdc); }
  bool map(uint32_t& n) { return header(n, 0x80, 0xde); }

  // Skips one object that msgpack-python decodes by itself (anything but extension types).
  bool skip(int depth) {
    if (p_ >= end_ || depth > kMaxDepth) return false;
    const uint8_t b = *p_;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return advance(1);
    if ((b & 0xe0) == 0xa0 || (b >= 0xd9 && b <= 0xdb)) {
      const char* s;
      uint32_t n;
      return str(s, n);
    }
    uint32_t n;
    if ((b & 0xf0) == 0x90 || b == 0xdc || b == 0xdd) {
      if (!array(n)) return false;
      for (uint32_t i = 0; i < n; ++i) {
        if (!skip(depth + 1)) return false;
      }
      return true;
    }
    if ((b & 0xf0) == 0x80 || b == 0xde || b == 0xdf) {
      if (!map(n)) return false;
      for (uint32_t i = 0; i < n; ++i) {
        if (!hashable(depth + 1) || !skip(depth + 1)) return false;
      }
      return true;
    }
    switch (b) {
      case 0xc4:
        return bin(1);
      case 0xc5:
        return bin(2);
      case 0xc6:
        return bin(4);
      case 0xca:
        return advance(5);
      case 0xcb:
        return advance(9);
      case 0xcc:
      case 0xd0:
        return advance(2);
      case 0xcd:
      case 0xd1:
        return advance(3);
      case 0xce:
      case 0xd2:
        return advance(5);
      case 0xcf:
      case 0xd3:
        return advance(9);
      default:
        return false;  // 0xc1 (never used) and extension types
    }
  }

 private:
  bool avail(size_t n) const { return static_cast<size_t>(end_ - p_) >= n; }
  bool advance(size_t n) {
    if (!avail(n)) return false;
    p_ += n;
    return true;
  }
  bool header(uint32_t& n, uint8_t fix, uint8_t wide16) {
    if (p_ >= end_) return false;
    const uint8_t b = *p_;
    if ((b & 0xf0) == fix) {
      n = b & 0x0f;
      return advance(1);
    }
    if (b == wide16 || b == wide16 + 1) {
      const int width = b == wide16 ? 2 : 4;
      if (!avail(1 + width)) return false;
      n = static_cast<uint32_t>(big_endian(p_ + 1, width));
      // Each element takes a byte at least: a longer count is malformed.
      p_ += 1 + width;
      return avail(n);
    }
    return false;
  }
  bool bin(int width) {
    if (!avail(1 + width)) return false;
    const uint64_t n = big_endian(p_ + 1, width);
    return advance(1 + width + n);
  }
  // A map key a Python dict takes: not an array or a map (they decode to list and dict).
  bool hashable(int depth) {
    if (p_ >= end_) return false;
    const uint8_t b = *p_;
    if ((b & 0xe0) == 0x80 || (b >= 0xdc && b <= 0xdf)) return false;
    return skip(depth);
  }

  const uint8_t* p_;
  const uint8_t* end_;
};

// msgpack-python's packing of the same values (Packer(use_bin_type=True)): smallest forms.
void put_byte(std::string& o, uint8_t b) { o.push_back(static_cast<char>(b)); }
void put_be(std::string& o, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i) put_byte(o, static_cast<uint8_t>(v >> (8 * i)));
}
void put_array(std::string& o, uint32_t n) {
  if (n < 16) {
    put_byte(o, static_cast<uint8_t>(0x90 | n));
  } else if (n < 65536) {
    put_byte(o, 0xdc);
    put_be(o, n, 2);
  } else {
    put_byte(o, 0xdd);
    put_be(o, n, 4);
  }
}
void put_str(std::string& o, const char* s, uint32_t n) {
  if (n < 32) {
    put_byte(o, static_cast<uint8_t>(0xa0 | n));
  } else if (n < 256) {
    put_byte(o, 0xd9);
    put_be(o, n, 1);
  } else if (n < 65536) {
    put_byte(o, 0xda);
    put_be(o, n, 2);
  } else {
    put_byte(o, 0xdb);
    put_be(o, n, 4);
  }
  o.append(s, n);
}
void put_int(std::string& o, const Int& v) {
  if (!v.negative) {
    const uint64_t d = v.u;
    if (d < 128) {
      put_byte(o, static_cast<uint8_t>(d));
    } else if (d < 256) {
      put_byte(o, 0xcc);
      put_be(o, d, 1);
    } else if (d < 65536) {
      put_byte(o, 0xcd);
      put_be(o, d, 2);
    } else if (d < (1ULL << 32)) {
      put_byte(o, 0xce);
      put_be(o, d, 4);
    } else {
      put_byte(o, 0xcf);
      put_be(o, d, 8);
    }
    return;
  }
  const int64_t d = v.s;
  if (d >= -32) {
    put_byte(o, static_cast<uint8_t>(d));
  } else if (d >= -128) {
    put_byte(o, 0xd0);
    put_be(o, static_cast<uint64_t>(d), 1);
  } else if (d >= -32768) {
    put_byte(o, 0xd1);
    put_be(o, static_cast<uint64_t>(d), 2);
  } else if (d >= INT32_MIN) {
    put_byte(o, 0xd2);
    put_be(o, static_cast<uint64_t>(d), 4);
  } else {
    put_byte(o, 0xd3);
    put_be(o, static_cast<uint64_t>(d), 8);
  }
}
void put_int64(std::string& o, int64_t v) {
  put_int(o, v < 0 ? Int{true, 0, v} : Int{false, static_cast<uint64_t>(v), 0});
}
void put_raw64(std::string& o, int64_t v) { o.append(reinterpret_cast<const char*>(&v), 8); }

// The fields of a tensor entry the alignment reads.
struct Entry {
  const char* dtype = nullptr;  // null: absent or nil (Python's entry.get("d") is None)
  uint32_t dtype_len = 0;
  std::vector<Int> shape;
  int64_t flags = 0;
  bool has_hash = false;  // false: absent or nil
  Int hash;
  int nonfinite = 0;  // kHasNan | kHasInf, from the stats
};

// The NaN and Inf counts of a stats value ([min, max, mean, absmax, nan, inf] as the recorder
// writes it). A count counts when it is a positive integer, as nonfinite_mask() reads it in
// Python; any other value is skipped like an unknown field.
bool read_stats(Msg& m, int& nonfinite) {
  uint32_t n;
  if (!m.array(n)) return m.skip(1);
  for (uint32_t k = 0; k < n; ++k) {
    Int count;
    if (n == 6 && k >= 4 && m.integer(count)) {
      if (!count.negative && count.u != 0) nonfinite |= k == 4 ? kHasNan : kHasInf;
    } else if (!m.skip(2)) {
      return false;
    }
  }
  return true;
}

bool read_entry(Msg& m, bool output, Entry& e) {
  uint32_t n;
  if (!m.map(n)) return false;
  e.dtype = nullptr;
  e.shape.clear();
  e.flags = 0;
  e.has_hash = false;
  e.nonfinite = 0;
  bool seen_d = false, seen_s = false, seen_f = false, seen_h = false, seen_m = false;
  for (uint32_t i = 0; i < n; ++i) {
    const char* name;
    uint32_t len;
    if (!m.str(name, len)) return false;
    const char field = len == 1 ? name[0] : '\0';
    if (field == 'd') {
      if (seen_d) return false;
      seen_d = true;
      if (!m.nil() && !m.str(e.dtype, e.dtype_len)) return false;
    } else if (field == 's') {
      if (seen_s) return false;
      seen_s = true;
      uint32_t dims;
      if (!m.array(dims)) return false;
      e.shape.resize(dims);
      for (uint32_t k = 0; k < dims; ++k) {
        if (!m.integer(e.shape[k]) || !e.shape[k].fits_int64()) return false;
      }
    } else if (output && field == 'f') {
      if (seen_f || !m.int64(e.flags)) return false;
      seen_f = true;
    } else if (output && field == 'h') {
      if (seen_h) return false;
      seen_h = true;
      if (!m.nil()) {
        if (!m.integer(e.hash)) return false;
        e.has_hash = true;
      }
    } else if (field == 'm') {
      if (seen_m) return false;
      seen_m = true;
      if (!read_stats(m, e.nonfinite)) return false;
    } else if (!m.skip(1)) {
      return false;
    }
  }
  return true;
}

struct Record {
  int64_t index = 0;
  int64_t step = 0;
  std::string key;                 // op, phase, site, then each input's dtype and shape
  std::string out;                 // msgpack of the output contents
  const uint8_t* value = nullptr;  // raw msgpack of "v", the returned scalar
  size_t value_len = 0;
  int nonfinite_in = 0;  // kHasNan | kHasInf over the inputs' stats
  int nonfinite_out = 0;
};

void put_dtype(std::string& o, const Entry& e) {
  if (e.dtype == nullptr) {
    put_byte(o, 0xc0);
  } else {
    put_str(o, e.dtype, e.dtype_len);
  }
}

void put_shape(std::string& o, const Entry& e) {
  put_array(o, static_cast<uint32_t>(e.shape.size()));
  for (const Int& d : e.shape) put_int(o, d);
}

bool read_inputs(Msg& m, Entry& e, std::string& sig, int& nonfinite) {
  uint32_t n;
  if (!m.array(n)) return false;
  sig.append(reinterpret_cast<const char*>(&n), sizeof n);
  for (uint32_t i = 0; i < n; ++i) {
    if (!read_entry(m, false, e)) return false;
    nonfinite |= e.nonfinite;
    const uint32_t dlen = e.dtype == nullptr ? UINT32_MAX : e.dtype_len;
    sig.append(reinterpret_cast<const char*>(&dlen), sizeof dlen);
    if (e.dtype != nullptr) sig.append(e.dtype, e.dtype_len);
    const uint32_t dims = static_cast<uint32_t>(e.shape.size());
    sig.append(reinterpret_cast<const char*>(&dims), sizeof dims);
    for (const Int& d : e.shape) put_raw64(sig, d.as_int64());
  }
  return true;
}

bool read_outputs(Msg& m, Entry& e, std::string& out, int& nonfinite) {
  uint32_t n;
  if (!m.array(n)) return false;
  put_array(out, n);
  for (uint32_t i = 0; i < n; ++i) {
    if (!read_entry(m, true, e)) return false;
    nonfinite |= e.nonfinite;
    put_array(out, 3);
    if (e.flags & kFlagUninitialized) {
      put_str(out, "uninitialized", 13);
      put_dtype(out, e);
      put_shape(out, e);
    } else if (e.flags & kFlagView) {
      put_str(out, "view", 4);
      put_dtype(out, e);
      put_shape(out, e);
    } else {
      put_dtype(out, e);
      put_shape(out, e);
      if (e.has_hash) {
        put_int(out, e.hash);
      } else {
        put_byte(out, 0xc0);
      }
    }
  }
  return true;
}

// Reads one op record (schema.py: a map with short keys). False: leave it to Python.
bool read_record(const uint8_t* data, size_t size, Entry& e, std::string& sig, Record& r) {
  Msg m(data, size);
  uint32_t n;
  if (!m.map(n)) return false;
  bool seen_i = false, seen_o = false, seen_s = false, seen_p = false, seen_c = false;
  bool seen_x = false, seen_y = false, seen_v = false;
  int64_t op = 0, phase = 3, site = -1;  // the Python reader's defaults
  r.step = 0;
  r.value = nullptr;
  r.nonfinite_in = r.nonfinite_out = 0;
  r.out.clear();
  sig.clear();
  for (uint32_t i = 0; i < n; ++i) {
    const char* name;
    uint32_t len;
    if (!m.str(name, len)) return false;
    const char field = len == 1 ? name[0] : '\0';
    bool ok = true;
    switch (field) {
      case 'i':
        ok = !seen_i && m.int64(r.index);
        seen_i = true;
        break;
      case 'o':
        ok = !seen_o && m.int64(op);
        seen_o = true;
        break;
      case 's':
        ok = !seen_s && m.int64(r.step);
        seen_s = true;
        break;
      case 'p':
        ok = !seen_p && m.int64(phase);
        seen_p = true;
        break;
      case 'c':
        ok = !seen_c && m.int64(site);
        seen_c = true;
        break;
      case 'x':
        ok = !seen_x && read_inputs(m, e, sig, r.nonfinite_in);
        seen_x = true;
        break;
      case 'y':
        ok = !seen_y && read_outputs(m, e, r.out, r.nonfinite_out);
        seen_y = true;
        break;
      case 'v': {
        const uint8_t* start = m.pos();
        ok = !seen_v && m.skip(1);
        seen_v = true;
        r.value = start;
        r.value_len = static_cast<size_t>(m.pos() - start);
        break;
      }
      default:
        ok = m.skip(1);
    }
    if (!ok) return false;
  }
  if (!m.done() || !seen_i || !seen_o) return false;
  if (!seen_y) put_array(r.out, 0);
  r.key.clear();
  put_raw64(r.key, op);
  put_raw64(r.key, phase);
  put_raw64(r.key, site);
  if (!seen_x) {
    const uint32_t zero = 0;
    r.key.append(reinterpret_cast<const char*>(&zero), sizeof zero);
  }
  r.key += sig;
  return true;
}

PyObject* new_list(Py_ssize_t n) {
  PyObject* list = PyList_New(n);
  if (list == nullptr) throw py::error_already_set();
  return list;
}

void set_none(PyObject* list, Py_ssize_t k) {
  Py_INCREF(Py_None);
  PyList_SET_ITEM(list, k, Py_None);
}

PyObject* checked(PyObject* obj) {
  if (obj == nullptr) throw py::error_already_set();
  return obj;
}

class OpScanner {
 public:
  // chunk: list of (key, value) pairs or of values, each value bytes (a record's msgpack).
  // Returns (index, step, output, fallback, values, new_keys, breaks): the first three one entry
  // per record (None where the record fell back); fallback: positions Python must decode;
  // values: (position, raw msgpack of "v"); new_keys: (position, key id) of key ids first met
  // here; breaks: positions where the step differs from the record before (valid when there is
  // no fallback).
  py::tuple scan(const py::list& chunk) {
    const Py_ssize_t n = PyList_GET_SIZE(chunk.ptr());
    py::object index = py::reinterpret_steal<py::object>(new_list(n));
    py::object step = py::reinterpret_steal<py::object>(new_list(n));
    py::object output = py::reinterpret_steal<py::object>(new_list(n));
    py::list fallback, values, new_keys, breaks;
    last_.assign(static_cast<size_t>(n), -1);
    nonfinite_.clear();
    bool have_previous = false;
    int64_t previous = 0;
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = PyList_GET_ITEM(chunk.ptr(), k);
      if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2) item = PyTuple_GET_ITEM(item, 1);
      const bool ok = PyBytes_Check(item) &&
                      read_record(reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(item)),
                                  static_cast<size_t>(PyBytes_GET_SIZE(item)), entry_, sig_, rec_);
      if (!ok) {
        set_none(index.ptr(), k);
        set_none(step.ptr(), k);
        set_none(output.ptr(), k);
        fallback.append(k);
        have_previous = false;
        continue;
      }
      PyList_SET_ITEM(index.ptr(), k, checked(PyLong_FromLongLong(rec_.index)));
      PyList_SET_ITEM(step.ptr(), k, checked(PyLong_FromLongLong(rec_.step)));
      PyList_SET_ITEM(output.ptr(), k,
                      checked(PyBytes_FromStringAndSize(rec_.out.data(), rec_.out.size())));
      auto found = ids_.find(rec_.key);
      int64_t id;
      if (found == ids_.end()) {
        id = static_cast<int64_t>(levels_.size());
        ids_.emplace(rec_.key, id);
        levels_.push_back({-1, -1, -1});
        new_keys.append(py::make_tuple(k, id));
      } else {
        id = found->second;
      }
      last_[static_cast<size_t>(k)] = id;
      if (rec_.value != nullptr) {
        values.append(py::make_tuple(
            k, py::bytes(reinterpret_cast<const char*>(rec_.value), rec_.value_len)));
      }
      if (rec_.nonfinite_in | rec_.nonfinite_out) {
        nonfinite_.push_back({static_cast<int64_t>(k), rec_.nonfinite_in, rec_.nonfinite_out});
      }
      if (have_previous && rec_.step != previous) breaks.append(k);
      previous = rec_.step;
      have_previous = true;
    }
    return py::make_tuple(index, step, output, fallback, values, new_keys, breaks);
  }

  // The alignment keys of key id `id` at each level.
  void define(int64_t id, int64_t k0, int64_t k1, int64_t k2) {
    if (id < 0 || static_cast<size_t>(id) >= levels_.size()) throw py::index_error("no such key");
    levels_[static_cast<size_t>(id)] = {k0, k1, k2};
  }

  // Per level, the keys of the last chunk's records (-1 where a record fell back).
  py::tuple levels() const {
    const Py_ssize_t n = static_cast<Py_ssize_t>(last_.size());
    std::array<py::object, 3> lists;
    for (auto& l : lists) l = py::reinterpret_steal<py::object>(new_list(n));
    for (Py_ssize_t k = 0; k < n; ++k) {
      const int64_t id = last_[static_cast<size_t>(k)];
      for (int level = 0; level < 3; ++level) {
        const int64_t v = id < 0 ? -1 : levels_[static_cast<size_t>(id)][level];
        PyList_SET_ITEM(lists[level].ptr(), k, checked(PyLong_FromLongLong(v)));
      }
    }
    return py::make_tuple(lists[0], lists[1], lists[2]);
  }

  size_t keys() const { return levels_.size(); }

  // (position, inputs, outputs) of the last chunk's records whose stats count NaN (1) or Inf
  // (2) values, as masks; records that fell back are not included.
  py::list nonfinite() const {
    py::list found;
    for (const auto& [k, in, out] : nonfinite_) found.append(py::make_tuple(k, in, out));
    return found;
  }

 private:
  std::unordered_map<std::string, int64_t> ids_;
  std::vector<std::array<int64_t, 3>> levels_;
  std::vector<int64_t> last_;
  std::vector<std::tuple<int64_t, int, int>> nonfinite_;
  Entry entry_;
  std::string sig_;
  Record rec_;
};

// The content of each entry of a step-level record (store/states.py: a map with "e", a list of
// [kind, name id, slot, tensor entry]) as bytes: kind, name id (through `rename`, B's ids to
// A's, -1 for a name A lacks), slot, dtype, shape, flags and fingerprint, leaving out what may
// differ between equal states (stats reduced in another order) or follows from the content
// (size, leading values). Equal results of two records mean equal states; false: leave the
// record to Python.
bool step_contents(const uint8_t* data, size_t size, const std::vector<int64_t>* rename, Entry& e,
                   std::string& out) {
  Msg m(data, size);
  uint32_t n;
  if (!m.map(n)) return false;
  bool seen_e = false;
  for (uint32_t i = 0; i < n; ++i) {
    const char* name;
    uint32_t len;
    if (!m.str(name, len)) return false;
    if (len != 1 || name[0] != 'e') {
      if (!m.skip(1)) return false;
      continue;
    }
    uint32_t entries;
    if (seen_e || !m.array(entries)) return false;
    seen_e = true;
    for (uint32_t k = 0; k < entries; ++k) {
      uint32_t parts;
      const char *kind, *slot;
      uint32_t kind_len, slot_len;
      int64_t id;
      if (!m.array(parts) || parts != 4 || !m.str(kind, kind_len) || !m.int64(id) ||
          !m.str(slot, slot_len) || !read_entry(m, true, e)) {
        return false;
      }
      if (rename != nullptr) {
        id = id >= 0 && static_cast<size_t>(id) < rename->size() ? (*rename)[id] : -1;
      }
      put_str(out, kind, kind_len);
      put_raw64(out, id);
      put_str(out, slot, slot_len);
      put_dtype(out, e);
      put_shape(out, e);
      put_raw64(out, e.flags);
      if (e.has_hash) {
        put_int(out, e.hash);
      } else {
        put_byte(out, 0xc0);
      }
    }
  }
  return seen_e && m.done();
}

py::object step_contents_of(const py::bytes& raw,
                            const std::optional<std::vector<int64_t>>& rename) {
  const std::string_view view = raw;
  Entry e;
  std::string out;
  if (!step_contents(reinterpret_cast<const uint8_t*>(view.data()), view.size(),
                     rename ? &*rename : nullptr, e, out)) {
    return py::none();
  }
  return py::bytes(out);
}

}  // namespace

void bind_opscan(py::module_& m) {
  m.def("step_contents", &step_contents_of, py::arg("raw"), py::arg("rename") = py::none(),
        "The content of a stored step-level record's entries as bytes (None: left to Python).");
  py::class_<OpScanner>(m, "OpScanner",
                        "Reads what alignment needs from stored op records (one per trace).")
      .def(py::init<>())
      .def("scan", &OpScanner::scan, py::arg("chunk"),
           "(index, step, output, fallback, values, new_keys, breaks) of a chunk of records.")
      .def("define", &OpScanner::define, py::arg("id"), py::arg("k0"), py::arg("k1"), py::arg("k2"),
           "Sets the alignment keys of a key id, one per level.")
      .def("levels", &OpScanner::levels, "Per level, the keys of the last chunk's records.")
      .def("nonfinite", &OpScanner::nonfinite,
           "(position, inputs, outputs) NaN (1) / Inf (2) masks of the last chunk's records.")
      .def_property_readonly("keys", &OpScanner::keys);
}

}  // namespace opguard

#include "content.h"

#include <array>
#include <cstring>
#include <string>

#include "tensor_probe.h"

namespace py = pybind11;

namespace opguard {
namespace {

constexpr double kCollectSeconds = 600.0;  // a kernel queued behind this long a step is stuck

// The hash of a view: little-endian u64 base hash, then each geometry value as a little-endian
// i64, fingerprinted as opaque bytes.
uint64_t view_hash(uint64_t base_hash, const std::vector<int64_t>& geometry) {
  std::vector<uint8_t> bytes(8 * (1 + geometry.size()));
  std::memcpy(bytes.data(), &base_hash, 8);
  std::memcpy(bytes.data() + 8, geometry.data(), 8 * geometry.size());
  const TensorView view{bytes.data(), 1, {static_cast<int64_t>(bytes.size())}, {1}, Kind::Opaque};
  return fingerprint_cpu(view, 0).hash;
}

}  // namespace

ContentPtr Content::flag(int flag) {
  // A flag's content never changes: each is made once and shared (never destroyed, as it may
  // be held past the interpreter's exit). Flags are the entry bits, below 16.
  static const auto* const shared = [] {
    auto* made = new std::array<ContentPtr, 16>();
    for (int f = 0; f < 16; ++f) {
      (*made)[f] = make(State::Flag);
      (*made)[f]->flags_ = f;
    }
    return made;
  }();
  if (flag >= 0 && flag < 16) return (*shared)[flag];
  ContentPtr c = make(State::Flag);
  c->flags_ = flag;
  return c;
}

ContentPtr Content::fingerprint(Fingerprint fp, Kind kind) {
  ContentPtr c = make(State::Fingerprint);
  c->fp_ = std::move(fp);
  c->kind_ = kind;
  return c;
}

ContentPtr Content::view_of(const ContentPtr& base, std::vector<int64_t> geometry, int64_t nbytes,
                            bool base_order) {
  ContentPtr c = make(State::View);
  c->flags_ = kFlagView;
  c->fp_.nbytes = static_cast<uint64_t>(nbytes);
  c->base_order_ = base_order;
  if (base->pending()) {
    c->base_ = base;
    c->geometry_ = std::move(geometry);
    c->resolved_.store(false, std::memory_order_relaxed);
  } else {
    c->derive_from(*base, geometry);
  }
  return c;
}

void Content::derive_from(const Content& base, const std::vector<int64_t>& geometry) {
  fp_.hash = view_hash(base.fp_.hash, geometry);
  if (base_order_) fp_.sketch = base.fp_.sketch;
}

#if OPGUARD_WITH_CUDA
ContentPtr Content::gpu(cuda::GpuFingerprinter* fingerprinter) {
  ContentPtr c = make(State::Fingerprint);
  c->fingerprinter_ = fingerprinter;
  c->resolved_.store(false, std::memory_order_relaxed);
  return c;
}
#endif

void Content::resolve() {
  if (!pending()) return;
  if (base_) {
    base_->resolve();
    derive_from(*base_, geometry_);
    base_.reset();
  } else {
#if OPGUARD_WITH_CUDA
    if (ticket_.seq == 0) {
      throw std::runtime_error("a GPU fingerprint was never launched (recording stopped first)");
    }
    fp_ = fingerprinter_->collect(ticket_, kCollectSeconds);
    kind_ = static_cast<Kind>(ticket_.kind);
#else
    throw std::logic_error("a GPU fingerprint in a build without CUDA");
#endif
  }
  resolved_.store(true, std::memory_order_release);
}

size_t Content::field_count(int entry_flags, bool with_sketch) const {
  const size_t flag = (flags_ | entry_flags) != 0;
  const size_t sketch = with_sketch && fp_.sketch.has_value();
  switch (state_) {
    case State::Flag:
      return flag;
    case State::View:
      return 2 + sketch + flag;
    case State::Fingerprint:
      return (has_stats(kind_) ? 4 : 3) + sketch + flag;
  }
  return 0;
}

void Content::pack(MsgpackOut& out, int entry_flags, bool with_sketch) const {
  if (state_ != State::Flag) {
    out.str("h"), out.uint(fp_.hash);
    out.str("z"), out.uint(fp_.nbytes);
  }
  if (state_ == State::Fingerprint) {
    out.str("b"), out.bin(fp_.head.data(), fp_.head.size());
    if (has_stats(kind_)) {
      // [min, max, mean, absmax] over the finite values (nil when none is finite), nan, inf
      const Stats& s = fp_.stats;
      out.str("m"), out.array(6);
      if (s.finite > 0) {
        out.float64(s.min), out.float64(s.max);
        out.float64(s.sum / static_cast<double>(s.finite)), out.float64(s.absmax);
      } else {
        for (int i = 0; i < 4; ++i) out.nil();
      }
      out.uint(s.nan), out.uint(s.inf);
    }
  }
  if (with_sketch && fp_.sketch) out.str("w"), out.bin(fp_.sketch->data(), fp_.sketch->size());
  if ((flags_ | entry_flags) != 0) out.str("f"), out.integer(flags_ | entry_flags);
}

py::dict Content::to_dict() {
  if (pending()) {
    py::gil_scoped_release release;
    resolve();
  }
  std::string packed;
  MsgpackOut out(packed);
  out.map(field_count(0));
  pack(out, 0);
  // what the trace's reader makes of the packed fields; never freed (it would outlive Python)
  static const py::object* const unpackb =
      new py::object(py::module_::import("msgpack").attr("unpackb"));
  return (*unpackb)(py::bytes(packed));
}

namespace {

// A GPU fingerprint as Python sees it (TensorProbe.fingerprint of a device tensor).
struct PendingFields {
  ContentPtr content;
};

}  // namespace

py::object content_to_python(const ContentPtr& content) {
  if (content->pending()) return py::cast(PendingFields{content});
  return content->to_dict();
}

void bind_content(py::module_& m) {
  py::class_<PendingFields>(m, "PendingFields",
                            "Content fields of a GPU fingerprint, known once its kernel has run.")
      .def(
          "resolve", [](PendingFields& self) { return self.content->to_dict(); },
          "The entry's content fields, waiting for the GPU if needed.");
}

}  // namespace opguard

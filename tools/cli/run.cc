// kpack run / kpack bench: one kernel of a pack on arguments given on the command line.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "commands.h"
#include "driver/driver.h"
#include "kpack/kpack.h"
#include "manifest/manifest.h"
#include "npy.h"
#include "util/status_macros.h"

namespace kpack::cli {
namespace {

using internal::Driver;

// A device buffer made for a pointer argument, and the array shape it stands for (what
// --out writes back).
struct Buffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  std::string dtype;
  std::vector<int64_t> shape;
};

// The driver, a context on the device, the runtime, and the call's arguments.
class Session {
 public:
  ~Session() {
    if (driver_ == nullptr) return;
    for (auto& [name, b] : buffers_) driver_->MemFree(b.ptr);
    runtime_.reset();
    if (retained_) driver_->DevicePrimaryCtxRelease(device_);
  }

  static absl::StatusOr<std::unique_ptr<Session>> Start(const RunOptions& o) {
    auto s = std::unique_ptr<Session>(new Session());
    // The pack and the kernel first: a wrong path or name is reported as such, also
    // where no driver loads.
    KPACK_ASSIGN_OR_RETURN(const Pack pack, Pack::Read(o.pack));
    KPACK_RETURN_IF_ERROR(pack.Find(o.kernel).status());
    KPACK_ASSIGN_OR_RETURN(s->driver_, Driver::Load(o.driver));
    const Driver& d = *s->driver_;
    KPACK_RETURN_IF_ERROR(
        d.Check(d.DeviceGet(&s->device_, o.device), absl::StrCat("cuDeviceGet(", o.device, ")")));
    CUcontext ctx;
    KPACK_RETURN_IF_ERROR(
        d.Check(d.DevicePrimaryCtxRetain(&ctx, s->device_), "cuDevicePrimaryCtxRetain"));
    s->retained_ = true;
    KPACK_RETURN_IF_ERROR(d.Check(d.CtxSetCurrent(ctx), "cuCtxSetCurrent"));
    Options options;
    options.driver_path = o.driver;
    KPACK_ASSIGN_OR_RETURN(Runtime rt, Runtime::Open(o.pack, options));
    s->runtime_ = std::make_unique<Runtime>(std::move(rt));
    KPACK_ASSIGN_OR_RETURN(s->kernel_, s->runtime_->Find(o.kernel));
    KPACK_RETURN_IF_ERROR(s->BuildArgs(o.args));
    if (!o.size_check_off) KPACK_RETURN_IF_ERROR(s->CheckBufferSizes());
    for (const std::string& spec : o.outputs) {
      KPACK_ASSIGN_OR_RETURN(Output out, s->ParseOutput(spec));
      s->outputs_.push_back(std::move(out));
    }
    if (!o.grid.empty()) {
      KPACK_ASSIGN_OR_RETURN(Grid g, ParseGrid(o.grid));
      s->grid_ = g;
    }
    return s;
  }

  const Driver& driver() const { return *driver_; }
  const Kernel& kernel() const { return kernel_; }
  const std::vector<Arg>& args() const { return args_; }
  const std::optional<Grid>& grid() const { return grid_; }

  // What a launch of the call will do, through the public API: the variant the
  // arguments select, its description, and the grid.
  struct Described {
    const VariantInfo* variant;
    Grid grid;
  };
  absl::StatusOr<Described> Describe() const {
    KPACK_ASSIGN_OR_RETURN(std::string_view name, kernel_.SelectVariant(args_));
    const std::vector<VariantInfo>& variants = kernel_.info().variants;
    auto it = std::find_if(variants.begin(), variants.end(),
                           [&](const VariantInfo& v) { return v.name == name; });
    Described d{&*it, grid_.value_or(Grid{})};
    if (!grid_.has_value()) {
      KPACK_ASSIGN_OR_RETURN(d.grid, kernel_.GridFor(args_));
    }
    return d;
  }

  absl::Status Launch(CUstream stream) const {
    return grid_.has_value() ? kernel_.LaunchArgs(*grid_, stream, args_)
                             : kernel_.LaunchArgs(stream, args_);
  }

  // Writes every --out buffer back (each checked at Start), saying so on `out`.
  absl::Status WriteOutputs(std::ostream& out) const {
    for (const Output& o : outputs_) {
      const Buffer& b = buffers_.at(o.name);
      NpyArray array;
      array.dtype = b.dtype;
      array.shape = b.shape;
      array.data.resize(b.bytes);
      KPACK_RETURN_IF_ERROR(driver_->Check(driver_->MemcpyDtoH(array.data.data(), b.ptr, b.bytes),
                                           absl::StrCat("cuMemcpyDtoH of '", o.name, "'")));
      KPACK_RETURN_IF_ERROR(WriteNpy(o.path, array));
      out << "wrote " << o.spec << "\n";
    }
    return absl::OkStatus();
  }

 private:
  Session() = default;

  // An --out name=@file.npy, checked before anything launches.
  struct Output {
    std::string spec, name, path;
  };
  absl::StatusOr<Output> ParseOutput(const std::string& spec) const {
    std::vector<std::string> parts = absl::StrSplit(spec, absl::MaxSplits('=', 1));
    if (parts.size() != 2 || parts[1].size() < 2 || parts[1][0] != '@') {
      return absl::InvalidArgumentError(
          absl::StrCat("--out '", spec, "': expected name=@file.npy"));
    }
    if (!buffers_.contains(parts[0])) {
      return absl::InvalidArgumentError(absl::StrCat("--out '", spec, "': '", parts[0],
                                                     "' is not a pointer argument of this call"));
    }
    return Output{spec, parts[0], parts[1].substr(1)};
  }

  // Every pointer argument's buffer holds at least as many elements as the smallest
  // positive integer argument of the call: a kernel indexes its buffers by its sizes, so a
  // buffer smaller than every size is almost surely a mistake that would read or write
  // past its end on the GPU. (Buffers smaller by design, say a one-element sum, need
  // --no-size-check.)
  absl::Status CheckBufferSizes() const {
    std::optional<std::pair<std::string, uint64_t>> smallest;
    for (size_t i = 0; i < kernel_.num_args(); ++i) {
      const std::string type(kernel_.arg_type(i));
      if (type.empty() || type[0] == '*' || type == "i1" || type == "u1" ||
          !(type[0] == 'i' || type[0] == 'u')) {
        continue;
      }
      const Arg& a = args_[i];
      uint64_t value = 0;
      if (a.kind() == Arg::Kind::kSigned && static_cast<int64_t>(a.bits()) > 0) {
        value = a.bits();
      } else if (a.kind() == Arg::Kind::kUnsigned) {
        value = a.bits();
      }
      if (value > 0 && (!smallest.has_value() || value < smallest->second)) {
        smallest.emplace(kernel_.arg_name(i), value);
      }
    }
    if (!smallest.has_value()) return absl::OkStatus();
    for (size_t i = 0; i < kernel_.num_args(); ++i) {
      const std::string name(kernel_.arg_name(i));
      const std::string type(kernel_.arg_type(i));
      if (type.empty() || type[0] != '*') continue;
      const Buffer& b = buffers_.at(name);
      const uint64_t elements = b.bytes / std::max<size_t>(DescrItemSize(b.dtype), 1);
      if (elements < smallest->second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--arg ", name, " (", type, "): the buffer has ", elements,
            " elements, fewer than the smallest size argument of the call (", smallest->first,
            "=", smallest->second, "): the kernel would likely access it past its end. "
            "Pass a larger buffer, or --no-size-check if it is small by design"));
      }
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<Grid> ParseGrid(const std::string& text) {
    std::vector<std::string> parts = absl::StrSplit(text, ',');
    uint32_t dims[3] = {1, 1, 1};
    if (parts.size() > 3) return absl::InvalidArgumentError("--grid takes at most X,Y,Z");
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!absl::SimpleAtoi(parts[i], &dims[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("--grid '", text, "': '", parts[i], "' is not a non-negative integer"));
      }
    }
    return Grid{dims[0], dims[1], dims[2]};
  }

  absl::Status BuildArgs(const std::vector<std::string>& specs) {
    std::map<std::string, std::string> values;
    for (const std::string& spec : specs) {
      std::vector<std::string> kv = absl::StrSplit(spec, absl::MaxSplits('=', 1));
      if (kv.size() != 2 || kv[0].empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--arg '", spec, "': expected name=VALUE"));
      }
      if (!kernel_.ArgIndex(kv[0]).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--arg '", spec, "': kernel '", std::string(kernel_.name()),
                         "' has no call parameter '", kv[0], "' (it takes ", Signature(), ")"));
      }
      if (!values.emplace(kv[0], kv[1]).second) {
        return absl::InvalidArgumentError(absl::StrCat("--arg ", kv[0], " given twice"));
      }
    }
    for (size_t i = 0; i < kernel_.num_args(); ++i) {
      const std::string name(kernel_.arg_name(i));
      auto it = values.find(name);
      if (it == values.end()) {
        return absl::InvalidArgumentError(absl::StrCat("missing --arg ", name, "=VALUE (kernel '",
                                                       std::string(kernel_.name()), "' takes ",
                                                       Signature(), ")"));
      }
      KPACK_ASSIGN_OR_RETURN(Arg a, MakeArg(name, std::string(kernel_.arg_type(i)), it->second));
      args_.push_back(a);
    }
    return absl::OkStatus();
  }

  std::string Signature() const {
    std::vector<std::string> params;
    for (size_t i = 0; i < kernel_.num_args(); ++i) {
      params.push_back(
          absl::StrCat(std::string(kernel_.arg_name(i)), ": ", std::string(kernel_.arg_type(i))));
    }
    return absl::StrJoin(params, ", ");
  }

  absl::StatusOr<Arg> MakeArg(const std::string& name, const std::string& type,
                              const std::string& value) {
    const std::string what = absl::StrCat("--arg ", name, "=", value, " (", type, ")");
    if (absl::StartsWith(type, "tensordesc<")) return MakeDesc(name, type, value, what);
    if (!type.empty() && type[0] == '*') {
      Buffer b;
      std::optional<NpyArray> array;
      if (!value.empty() && value[0] == '@') {
        KPACK_ASSIGN_OR_RETURN(array, ReadNpy(value.substr(1)));
        b.dtype = array->dtype;
        b.shape = array->shape;
        b.bytes = array->data.size();
      } else if (value.rfind("zeros:", 0) == 0) {
        std::vector<std::string> parts = absl::StrSplit(value, ':');
        int64_t count = 0;
        if (parts.size() != 3 || !absl::SimpleAtoi(parts[2], &count) || count < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": expected zeros:DTYPE:COUNT, e.g. zeros:float32:4096"));
        }
        KPACK_ASSIGN_OR_RETURN(b.dtype, DtypeDescr(parts[1]));
        b.shape = {count};
        b.bytes = static_cast<size_t>(count) * DescrItemSize(b.dtype);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": a pointer takes @file.npy or zeros:DTYPE:COUNT"));
      }
      // The elements must be the pointee's size (their kind may differ: bf16 travels as
      // uint16, and a float's bits may come as an unsigned integer of its size).
      const size_t pointee = static_cast<size_t>(internal::ElementBytes(type.substr(1)));
      if (pointee != 0 && DescrItemSize(b.dtype) != pointee) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": the buffer's elements (", b.dtype, ") are ", DescrItemSize(b.dtype),
            " bytes, the parameter's ", type.substr(1), " ", pointee));
      }
      KPACK_RETURN_IF_ERROR(Allocate(b, what));
      buffers_[name] = b;  // freed with the session from here on
      KPACK_RETURN_IF_ERROR(driver_->Check(
          array.has_value() ? driver_->MemcpyHtoD(b.ptr, array->data.data(), b.bytes)
                            : driver_->MemsetD8(b.ptr, 0, b.bytes),
          array.has_value() ? "cuMemcpyHtoD" : "cuMemsetD8"));
      return Arg(b.ptr);
    }
    if (type == "i1" || type == "u1") {
      if (value == "true" || value == "1") return Arg(true);
      if (value == "false" || value == "0") return Arg(false);
      return absl::InvalidArgumentError(absl::StrCat(what, ": expected true or false"));
    }
    if (type == "fp16" || type == "bf16" || type == "fp32" || type == "fp64") {
      double d;
      if (!absl::SimpleAtod(value, &d)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": expected a number"));
      }
      return Arg(d);
    }
    int64_t i;
    if (absl::SimpleAtoi(value, &i)) return Arg(i);
    uint64_t u;
    if (absl::SimpleAtoi(value, &u)) return Arg(u);
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected an integer"));
  }

  // A tensordesc argument: `tdesc:@file.npy` or `tdesc:zeros:DTYPE:D0xD1...`, optionally
  // followed by `:nan` (NaN padding). The tensor is contiguous, its shape the array's;
  // the block shape is the chosen variant's, from the manifest.
  absl::StatusOr<Arg> MakeDesc(const std::string& name, const std::string& type,
                               const std::string& value, const std::string& what) {
    const std::string usage = absl::StrCat(
        what, ": a tensordesc takes tdesc:@file.npy or tdesc:zeros:DTYPE:D0xD1[x...], each "
              "optionally followed by :nan (NaN padding), e.g. tdesc:zeros:float16:128x64");
    absl::string_view spec = value;
    if (!absl::ConsumePrefix(&spec, "tdesc:")) return absl::InvalidArgumentError(usage);
    TensorDesc desc;
    if (absl::ConsumeSuffix(&spec, ":nan")) desc.padding = TensorDescPadding::kNan;
    const size_t open = type.find('['), close = type.find(']');
    const std::string dtype = type.substr(11, open - 11);  // after "tensordesc<"
    const size_t rank =
        open == std::string::npos || close == std::string::npos
            ? 0
            : std::vector<std::string>(absl::StrSplit(type.substr(open + 1, close - open - 1), ','))
                  .size();
    Buffer b;
    if (absl::StartsWith(spec, "@")) {
      KPACK_ASSIGN_OR_RETURN(NpyArray array, ReadNpy(std::string(spec.substr(1))));
      b.dtype = array.dtype;
      b.shape = array.shape;
      b.bytes = array.data.size();
      KPACK_RETURN_IF_ERROR(CheckDescArray(b, dtype, rank, what));
      KPACK_RETURN_IF_ERROR(Allocate(b, what));
      KPACK_RETURN_IF_ERROR(
          driver_->Check(driver_->MemcpyHtoD(b.ptr, array.data.data(), b.bytes), "cuMemcpyHtoD"));
    } else if (absl::ConsumePrefix(&spec, "zeros:")) {
      std::vector<std::string> parts = absl::StrSplit(spec, ':');
      if (parts.size() != 2) return absl::InvalidArgumentError(usage);
      KPACK_ASSIGN_OR_RETURN(b.dtype, DtypeDescr(parts[0]));
      size_t count = 1;
      for (absl::string_view dim : absl::StrSplit(parts[1], 'x')) {
        int64_t n = 0;
        if (!absl::SimpleAtoi(dim, &n) || n < 1 || n > (int64_t{1} << 31) - 1) {
          return absl::InvalidArgumentError(
              absl::StrCat(usage, " ('", dim, "' is not a dimension in [1, 2^31))"));
        }
        b.shape.push_back(n);
        count *= static_cast<size_t>(n);
      }
      b.bytes = count * DescrItemSize(b.dtype);
      KPACK_RETURN_IF_ERROR(CheckDescArray(b, dtype, rank, what));
      KPACK_RETURN_IF_ERROR(Allocate(b, what));
      KPACK_RETURN_IF_ERROR(driver_->Check(driver_->MemsetD8(b.ptr, 0, b.bytes), "cuMemsetD8"));
    } else {
      return absl::InvalidArgumentError(usage);
    }
    desc.base = b.ptr;
    desc.rank = static_cast<int>(b.shape.size());
    int64_t stride = 1;
    for (int i = desc.rank; i-- > 0;) {
      desc.shape[i] = b.shape[i];
      desc.strides[i] = stride;
      stride *= b.shape[i];
    }
    buffers_[name] = b;
    descs_.push_back(desc);
    return Arg(descs_.back());
  }

  // The array of a tensordesc argument: the parameter's rank, and elements of its size.
  static absl::Status CheckDescArray(const Buffer& b, const std::string& dtype, size_t rank,
                                     const std::string& what) {
    if (b.shape.size() != rank || rank == 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the array has ", b.shape.size(),
                                                     " dimensions, the descriptor ", rank));
    }
    const size_t want = static_cast<size_t>(internal::ElementBytes(dtype));
    if (DescrItemSize(b.dtype) != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the array's elements (", b.dtype, ") are ", DescrItemSize(b.dtype),
                       " bytes, the descriptor's ", dtype, " ", want));
    }
    return absl::OkStatus();
  }

  absl::Status Allocate(Buffer& b, const std::string& what) {
    // Zero-size buffers still get a valid (1-byte) allocation: kernels may take the
    // address even when they read nothing.
    return driver_->Check(driver_->MemAlloc(&b.ptr, std::max<size_t>(b.bytes, 1)),
                          absl::StrCat("cuMemAlloc for ", what));
  }

  std::shared_ptr<const Driver> driver_;
  CUdevice device_ = 0;
  bool retained_ = false;
  std::unique_ptr<Runtime> runtime_;
  Kernel kernel_;
  std::vector<Arg> args_;
  std::deque<TensorDesc> descs_;  // what the tensordesc arguments point at (stable addresses)
  std::map<std::string, Buffer> buffers_;
  std::vector<Output> outputs_;
  std::optional<Grid> grid_;
};

std::string GridText(const Grid& g) { return absl::StrCat("(", g.x, ", ", g.y, ", ", g.z, ")"); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int Run(const RunOptions& o, std::ostream& out, std::ostream& err) {
  auto session = Session::Start(o);
  if (!session.ok()) {
    err << "kpack run: " << session.status().message() << "\n";
    return kFailed;
  }
  Session& s = **session;
  auto call = s.Describe();
  if (!call.ok()) {
    err << "kpack run: " << call.status().message() << "\n";
    return kFailed;
  }
  out << "kernel " << o.kernel << ": variant " << call->variant->name << ", grid "
      << GridText(call->grid) << (s.grid().has_value() ? "" : " (from the grid expressions)")
      << ", block " << 32 * call->variant->num_warps << "\n";
  absl::Status status = s.Launch(nullptr);
  if (status.ok()) status = s.driver().Check(s.driver().CtxSynchronize(), "the kernel");
  if (!status.ok()) {
    err << "kpack run: " << status.message() << "\n";
    return kFailed;
  }
  out << "launched and synchronized: OK\n";
  if (absl::Status w = s.WriteOutputs(out); !w.ok()) {
    err << "kpack run: " << w.message() << "\n";
    return kFailed;
  }
  return kOk;
}

int Bench(const RunOptions& o, std::ostream& out, std::ostream& err) {
  auto session = Session::Start(o);
  if (!session.ok()) {
    err << "kpack bench: " << session.status().message() << "\n";
    return kFailed;
  }
  Session& s = **session;
  const Driver& d = s.driver();
  auto call = s.Describe();
  if (!call.ok()) {
    err << "kpack bench: " << call.status().message() << "\n";
    return kFailed;
  }
  CUstream stream;
  if (d.StreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    err << "kpack bench: cuStreamCreate failed\n";
    return kFailed;
  }
  // The raw path sends the very buffer, config and function kpack would (a prepared
  // BoundLaunch of the same call): the difference between the two rows is kpack's own
  // work per launch.
  absl::StatusOr<BoundLaunch> bound =
      s.grid().has_value() ? s.kernel().Bind(*s.grid(), stream, s.args())
                           : s.kernel().Bind(stream, s.args());
  absl::StatusOr<PreparedLaunch> raw =
      bound.ok() ? bound->Prepare() : absl::StatusOr<PreparedLaunch>(bound.status());
  if (raw.ok() && raw->function == nullptr) raw = absl::InvalidArgumentError("the grid is empty");
  if (!raw.ok()) {
    err << "kpack bench: " << raw.status().message() << "\n";
    d.StreamDestroy(stream);
    return kFailed;
  }
  auto time_batches = [&](auto&& launch) {
    std::vector<double> per_launch;
    for (int r = 0; r < o.repetitions + 1; ++r) {  // the first batch warms up
      d.StreamSynchronize(stream);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.batch; ++i) launch();
      auto t1 = std::chrono::steady_clock::now();
      if (r > 0) {
        per_launch.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / o.batch);
      }
    }
    d.StreamSynchronize(stream);
    return per_launch;
  };
  bool ok = true;
  std::vector<double> kpack_us = time_batches([&] { ok &= s.Launch(stream).ok(); });
  std::vector<double> raw_us = time_batches([&] {
    ok &= d.LaunchKernelEx(&raw->config, raw->function, nullptr, raw->extra) == CUDA_SUCCESS;
  });
  d.StreamDestroy(stream);
  if (!ok) {
    err << "kpack bench: a launch failed\n";
    return kFailed;
  }
  const double kpack_m = Median(kpack_us), raw_m = Median(raw_us);
  out << "kernel " << o.kernel << ": variant " << call->variant->name << ", grid "
      << GridText(call->grid) << ", " << o.repetitions << " batches of " << o.batch
      << " launches\n";
  out << absl::StrFormat("%-34s %10s %10s %10s\n", "host time per launch", "median us", "min us",
                         "x raw");
  out << absl::StrFormat("%-34s %10.3f %10.3f %10.3f\n", "raw cuLaunchKernelEx", raw_m,
                         *std::min_element(raw_us.begin(), raw_us.end()), 1.0);
  out << absl::StrFormat("%-34s %10.3f %10.3f %10.3f\n", "kpack (dispatch, pack, launch)", kpack_m,
                         *std::min_element(kpack_us.begin(), kpack_us.end()), kpack_m / raw_m);
  return kOk;
}

}  // namespace kpack::cli

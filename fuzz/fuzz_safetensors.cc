// libFuzzer target for the safetensors reader. Any input must either parse or throw
// dsv4::Error; other exceptions, crashes and sanitizer reports are bugs. Inputs that parse
// are also checked: every view lies inside the input and has numel * dtype-size bytes, and
// re-encoding the tensors gives a file that parses back to the same tensors.
//
//   ./fuzz_safetensors -max_total_time=60 ../fuzz/corpus/safetensors
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/safetensors.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> image(data, size);
  std::vector<dsv4::TensorData> tensors;
  std::map<std::string, std::string> metadata;
  try {
    const dsv4::SafetensorsFile file = dsv4::SafetensorsFile::parse(image, "fuzz input");
    metadata = file.metadata();
    for (const auto& [name, view] : file.tensors()) {
      check(view.name == name);
      check(view.bytes.empty() || (view.bytes.data() >= data + 8 &&
                                   view.bytes.data() + view.bytes.size() <= data + size));
      check(view.bytes.size() == static_cast<std::size_t>(view.numel()) * dsv4::dtype_size(view.dtype));
      if (view.bytes.size() > (std::size_t{1} << 20)) return 0;  // cannot happen for small inputs
      tensors.push_back(dsv4::TensorData{view.name, view.dtype, view.shape,
                                         {view.bytes.begin(), view.bytes.end()}});
    }
  } catch (const dsv4::Error&) {
    return 0;
  }
  // Outside the try: an Error here (writer rejects what the reader accepted) is a bug too.
  const std::vector<std::uint8_t> again = dsv4::encode_safetensors(tensors, metadata);
  const dsv4::SafetensorsFile reread = dsv4::SafetensorsFile::parse(again, "re-encoded");
  check(reread.metadata() == metadata);
  check(reread.tensors().size() == tensors.size());
  for (const auto& tensor : tensors) {
    const auto it = reread.tensors().find(tensor.name);
    check(it != reread.tensors().end());
    check(it->second.dtype == tensor.dtype && it->second.shape == tensor.shape);
    check(it->second.bytes.size() == tensor.bytes.size());
    check(tensor.bytes.empty() ||
          std::memcmp(it->second.bytes.data(), tensor.bytes.data(), tensor.bytes.size()) == 0);
  }
  return 0;
}

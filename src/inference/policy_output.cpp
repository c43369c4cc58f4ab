#include "policy_output.h"

#include <string>

namespace tensorwire::inference::detail {

void check_output_rows(const TensorDict& output, int64_t rows) {
  if (output.batch_dims() == 0 || output.batch_size()[0] != rows)
    throw ValueError("the policy returned a TensorDict of batch size " +
                     shape_str(output.batch_size()) + " for a batch of " + std::to_string(rows) +
                     " requests");
}

}  // namespace tensorwire::inference::detail

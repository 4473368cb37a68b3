#include "ir/op.h"

namespace tpj::ir {

namespace {
struct OpRow {
  const char* name;
  const char* mlir;
  OpForm form;
};
constexpr OpRow kOps[] = {
#define TPJ_ROW(name, mlir, form) {#name, mlir, OpForm::form},
    TPJ_IR_OPS(TPJ_ROW)
#undef TPJ_ROW
};
}  // namespace

const char* OpName(Op op) { return kOps[static_cast<int>(op)].name; }
const char* MlirOpName(Op op) { return kOps[static_cast<int>(op)].mlir; }
OpForm Form(Op op) { return kOps[static_cast<int>(op)].form; }

}  // namespace tpj::ir

// Everything a C++ user of tensorwire needs, in one include.
#pragma once

#include "tensorwire/core/consolidate.h"
#include "tensorwire/core/tensordict.h"
#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"
#include "tensorwire/wire/file.h"

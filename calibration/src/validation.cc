// Placeholder: being written (validation.h).
#include "moeplan/calibration/validation.h"

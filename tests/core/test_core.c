#include <criterion/criterion.h>
#include "dormant.h"

Test(smoke, new_destroy)
{
	struct dormant *m = NULL;
	cr_assert_eq(dormant_new(NULL, &m), 0, "%s", dormant_last_error());
	dormant_destroy(m);
}

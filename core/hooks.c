/* SPDX-License-Identifier: MIT */
/*
 * The manager's callbacks around a transition: the hooks (their registry,
 * and hooks_run(), which turns a refusing hook into the transition's error)
 * and the rebuild callbacks of DORMANT_REBUILD tags (hooks_rebuild()).
 * transition.c calls them at its points, without the manager lock.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "manager.h"

DORMANT_EXPORT int dormant_hook_add(struct dormant *m, enum dormant_hook_point point,
				    dormant_hook_fn fn, void *userdata)
{
	int r;

	if (!m || !fn)
		return error_set(-EINVAL, "manager or hook is NULL");
	if ((unsigned)point > DORMANT_HOOK_BEFORE_REBUILD)
		return error_set(-EINVAL, "unknown hook point %d", (int)point);
	pthread_mutex_lock(&m->lock);
	if (m->hook_count == HOOKS_MAX) {
		r = error_set(-ENOSPC, "too many hooks (at most %d)", HOOKS_MAX);
	} else {
		r = m->next_hook_id++;
		m->hooks[m->hook_count++] = (struct hook){ .id = r, .point = point, .fn = fn,
							   .userdata = userdata };
	}
	pthread_mutex_unlock(&m->lock);
	return r;
}

DORMANT_EXPORT int dormant_hook_remove(struct dormant *m, int id)
{
	int r = -ENOENT;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->hook_count; i++) {
		if (m->hooks[i].id != id)
			continue;
		for (size_t j = i + 1; j < m->hook_count; j++)
			m->hooks[j - 1] = m->hooks[j];
		m->hook_count--;
		r = 0;
		break;
	}
	pthread_mutex_unlock(&m->lock);
	if (r < 0)
		return error_set(r, "no hook %d", id);
	return 0;
}

DORMANT_EXPORT int dormant_hook_set_error(const char *message)
{
	if (!message)
		return error_set(-EINVAL, "message is NULL");
	/* the thread's error buffer is what a failing transition reads */
	error_set(-ECANCELED, "%s", message);
	return 0;
}

/* What a hook's failure does at each point: the failed transition's words. */
static const char *const hook_failure[] = {
	[DORMANT_HOOK_BEFORE_SLEEP] = "a before-sleep hook cancelled the sleep",
	[DORMANT_HOOK_BEFORE_WAKE] = "a before-wake hook cancelled the wake",
	[DORMANT_HOOK_AFTER_COPIES] = "an after-copies hook failed",
	[DORMANT_HOOK_BEFORE_REBUILD] = "a before-rebuild hook failed",
};

/* The hooks of point, copied under the lock, run without it (manager.h). */
int hooks_run(struct dormant *m, enum dormant_hook_point point, double *seconds)
{
	const char *failure = (size_t)point < ARRAY_SIZE(hook_failure) ? hook_failure[point] : NULL;
	double start = now_monotonic_s();
	struct hook hooks[HOOKS_MAX];
	char why[DORMANT_ERROR_MAX];
	size_t count = 0;
	int r = 0;

	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->hook_count; i++)
		if (m->hooks[i].point == point)
			hooks[count++] = m->hooks[i];
	pthread_mutex_unlock(&m->lock);
	if (failure)
		error_clear(); /* what a failing hook says (dormant_hook_set_error()) */
	for (size_t i = 0; i < count && r == 0; i++)
		r = hooks[i].fn(m, point, hooks[i].userdata);
	if (seconds)
		*seconds += now_monotonic_s() - start;
	if (r == 0 || !failure)
		return r;
	snprintf(why, sizeof(why), "%s", dormant_last_error());
	return error_set(-ECANCELED, "%s (it returned %d)%s%s", failure, r, why[0] ? ": " : "",
			 why);
}

/* Each callback runs without the lock, on its tag's name copied (manager.h). */
int hooks_rebuild(struct dormant *m, struct tag *const *tags, size_t tag_count,
		  const struct engine_item *items, size_t item_count, bool sleep)
{
	int r = 0;

	pthread_mutex_lock(&m->lock);
	m->rebuilding = true;
	for (size_t i = 0; i < tag_count && r == 0; i++) {
		struct tag *tag = tags[i];
		dormant_rebuild_fn fn = tag->rebuild_fn;
		void *userdata = tag->rebuild_userdata;
		bool needed = !sleep;
		char name[DORMANT_TAG_MAX + 1];
		int result;

		if (tag->policy != DORMANT_REBUILD || !fn)
			continue;
		for (size_t k = 0; k < item_count && !needed; k++)
			needed = items[k].owner.held == &tag->held && /* of this tag */
				 items[k].policy == DORMANT_REBUILD && items[k].mapped_here;
		if (!needed)
			continue;
		memcpy(name, tag->name, sizeof(name));
		pthread_mutex_unlock(&m->lock);
		error_clear();
		result = fn(m, name, userdata);
		if (result != 0) {
			/* a copy: dormant_last_error() is the buffer error_set() writes */
			char why[DORMANT_ERROR_MAX];

			snprintf(why, sizeof(why), "%s", dormant_last_error());
			r = error_set(-ECANCELED, "rebuilding tag '%s' failed (its callback returned %d)%s%s",
				      name, result, why[0] ? ": " : "", why);
		}
		pthread_mutex_lock(&m->lock);
	}
	m->rebuilding = false;
	pthread_mutex_unlock(&m->lock);
	return r;
}
